package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/memsh/memsh/record"
)

func init() { subcommands["merge"] = mergeCommand }

// memsh merge A.jsonl B.jsonl ... [-o ALL.jsonl] combines the --out files
// of a sweep's shards (or of a run and its resumptions) into the records
// one unsharded run writes (see record.Merge).
func mergeCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memsh merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the merged records to `FILE` (default: standard output)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: memsh merge A.jsonl B.jsonl ... [-o ALL.jsonl]")
		fs.PrintDefaults()
	}
	files, code := parseInterspersed(fs, args)
	if code >= 0 {
		return code
	}
	if len(files) == 0 {
		fs.Usage()
		return 2
	}
	var sets [][]*record.Record
	for _, name := range files {
		recs, err := record.ReadFile(name)
		if err != nil {
			fmt.Fprintf(stderr, "memsh merge: %v\n", err)
			return 1
		}
		sets = append(sets, recs)
	}
	merged := record.Merge(sets...)
	w := stdout
	var f *os.File
	if *out != "" {
		var err error
		if f, err = os.Create(*out); err != nil {
			fmt.Fprintf(stderr, "memsh merge: %v\n", err)
			return 1
		}
		w = f
	}
	err := record.WriteAll(w, merged)
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "memsh merge: %v\n", err)
		return 1
	}
	if *out != "" {
		fmt.Fprintf(stderr, "memsh merge: %d records from %d files to %s\n", len(merged), len(files), *out)
	}
	return 0
}
