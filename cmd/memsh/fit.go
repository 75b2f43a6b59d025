package main

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/record"
	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
)

func init() { subcommands["fit"] = fitCommand }

// memsh fit MODEL [--gpu H100] [--seq N] [--batch N] [--precision
// fp32|bf16|fp16] [--optimizer adamw|adam|sgd] [--checkpoint] runs
// scripts/fit.star (embedded in the binary, with scripts/models) for one
// model on a meta simulator of the GPU preset: the largest batch that
// trains at the sequence length (--seq, default the model's), or with
// --batch the longest sequence at that batch (language models).
func fitCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memsh fit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gpu := fs.String("gpu", "H100", "the simulated GPU `PRESET` (memsh devices --presets), or a size (80GiB)")
	seq := fs.Int("seq", 0, "sequence length `N` for the batch search (default: the model's)")
	batch := fs.Int("batch", 0, "find the longest sequence at batch `N` instead (language models)")
	precision := fs.String("precision", "bf16", "fp32, bf16 or fp16 (autocast when memsh has it, else fp32)")
	optimizer := fs.String("optimizer", "adamw", "adamw, adam or sgd")
	checkpoint := fs.Bool("checkpoint", false, "activation checkpointing per layer (when memsh has nn.checkpoint)")
	out := fs.String("out", "", "append the trials' records to `FILE.jsonl` (memsh plot FILE.jsonl)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: memsh fit MODEL [--gpu H100] [--seq N] [--batch N] [--precision fp32|bf16|fp16] [--optimizer adamw|adam|sgd] [--checkpoint]")
		fmt.Fprintln(stderr, "models: gpt2-small gpt2-medium gpt2-large gpt2-xl llama-3.2-1b llama-3.1-8b resnet18 resnet50")
		fs.PrintDefaults()
	}
	rest, code := parseInterspersed(fs, args)
	if code >= 0 {
		return code
	}
	if len(rest) != 1 {
		fs.Usage()
		return 2
	}
	if *seq < 0 || *batch < 0 {
		fmt.Fprintln(stderr, "memsh fit: --seq and --batch want positive integers")
		return 2
	}
	argv := []string{rest[0], "--precision", *precision, "--optimizer", *optimizer, "--checkpoint", map[bool]string{true: "on", false: "off"}[*checkpoint]}
	if *batch > 0 {
		argv = append(argv, "--what", "seq", "--batch", strconv.Itoa(*batch))
	} else {
		argv = append(argv, "--what", "batch")
	}
	if *seq > 0 {
		argv = append(argv, "--seq", strconv.Itoa(*seq))
	}

	dir, err := os.MkdirTemp("", "memsh-fit-")
	if err != nil {
		fmt.Fprintln(stderr, "memsh fit:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := writeEmbedded(dir); err != nil {
		fmt.Fprintln(stderr, "memsh fit:", err)
		return 1
	}
	device := "sim:" + strings.TrimPrefix(*gpu, "sim:")
	if !strings.Contains(device, "meta") {
		device += ",meta"
	}
	s, err := scope.New(scope.Options{Device: device, Peak: backend.PeakExact, Out: stdout, Err: stderr, Argv: argv})
	if err != nil {
		fmt.Fprintln(stderr, "memsh fit:", err)
		return 2
	}
	defer s.Close()
	if *out != "" {
		st := record.Of(s.Env())
		if err := st.Open(*out); err != nil {
			fmt.Fprintln(stderr, "memsh fit: --out", err)
			return 2
		}
		defer st.Close()
	}
	if err := repl.Interruptible(s, func() error { return s.Exec(filepath.Join(dir, "fit.star"), nil) }); err != nil {
		return failed(s, stderr, err)
	}
	return 0
}

// writeEmbedded copies fit.star and models/ out of the binary into dir.
func writeEmbedded(dir string) error {
	return fs.WalkDir(scripts.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := scripts.FS.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}
