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
		fs.Var(f, "log", "after each statement or REPL input, log memory (consumed, peaked, used), time and CPU; --log=compact: one line")
		return func(s *scope.Session) (func(), error) {
			if f.mode == "" {
				return nil, nil
			}
			if err := memlog.Start(s.Env(), f.mode == "compact"); err != nil {
				return nil, err
			}
			return func() { memlog.Stop(s.Env()) }, nil
		}
	})
}
