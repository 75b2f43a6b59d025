package main

import (
	"flag"
	"fmt"

	"github.com/memsh/memsh/scope"
	memlog "github.com/memsh/memsh/starlib/log"
)

// logFlag is --log[=compact]: a boolean flag that also takes "compact".
type logFlag struct{ mode string }

func (f *logFlag) String() string { return f.mode }

// IsBoolFlag lets --log stand alone.
func (f *logFlag) IsBoolFlag() bool { return true }

func (f *logFlag) Set(v string) error {
	switch v {
	case "true", "on":
		f.mode = "on"
	case "false", "off":
		f.mode = ""
	case "compact":
		f.mode = "compact"
	default:
		return fmt.Errorf("want --log or --log=compact, got %q", v)
	}
	return nil
}

func init() {
	sessionFlags = append(sessionFlags, func(fs *flag.FlagSet) func(s *scope.Session) (func(), error) {
		f := &logFlag{}
		fs.Var(f, "log", "after each statement or REPL input, log memory (consumed, peaked, used), time and CPU to stderr; --log=compact: one line")
		file := fs.String("log-file", "", "write the --log lines to `PATH` instead of stderr: a new file, or appended to a log memsh wrote (its first line '# memsh log 1')")
		return func(s *scope.Session) (func(), error) {
			if f.mode == "" {
				if *file != "" {
					return nil, fmt.Errorf("--log-file needs --log or --log=compact")
				}
				return nil, nil
			}
			w, closeFile := s.Env().Err, func() error { return nil }
			if *file != "" {
				fh, err := memlog.OpenFile(*file)
				if err != nil {
					return nil, fmt.Errorf("--log-file %v", err)
				}
				w, closeFile = fh, fh.Close
			}
			if err := memlog.StartTo(s.Env(), f.mode == "compact", w); err != nil {
				_ = closeFile()
				return nil, err
			}
			return func() {
				memlog.Stop(s.Env())
				if err := closeFile(); err != nil {
					outputFailed(s, fmt.Errorf("--log-file %s: %v", *file, err))
				}
			}, nil
		}
	})
}
