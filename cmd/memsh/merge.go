package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/memsh/memsh/fsafe"
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
	force := fs.Bool("force", false, "replace FILE even if it is not a file of records memsh wrote")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: memsh merge A.jsonl B.jsonl ... [-o ALL.jsonl [--force]]")
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
	var err error
	if *out != "" {
		// Whole or not at all; an existing file is replaced only if it
		// holds memsh's records (one of the inputs, say), or --force.
		err = fsafe.WriteFile(*out, fsafe.Records, *force, func(w io.Writer) error { return record.WriteAll(w, merged) })
	} else {
		err = record.WriteAll(stdout, merged)
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
