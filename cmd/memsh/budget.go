package main

import (
	"flag"
	"fmt"

	"github.com/dustin/go-humanize"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib"
)

// exitBudget is memsh's exit status when a --max-peak or budget() limit
// was exceeded (and the script otherwise succeeded).
const exitBudget = 3

// sizeFlag is a byte count given as "2GiB", "512MiB" or "1000000".
type sizeFlag struct{ n uint64 }

func (f *sizeFlag) String() string {
	if f == nil || f.n == 0 {
		return ""
	}
	return humanize.IBytes(f.n)
}

func (f *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}

func parseSize(v string) (uint64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("want a size such as 2GiB or 512MiB, got %q", v)
	}
	return n, nil
}

// maxPeakOf returns the --max-peak of fs (0 when not given).
func maxPeakOf(fs *flag.FlagSet) uint64 {
	if f := fs.Lookup("max-peak"); f != nil {
		return f.Value.(*sizeFlag).n
	}
	return 0
}

func init() {
	sessionFlags = append(sessionFlags, func(fs *flag.FlagSet) func(s *scope.Session) (func(), error) {
		maxPeak := &sizeFlag{}
		fs.Var(maxPeak, "max-peak", "fail (exit status 3) when a top-level statement, experiment or trial peaks above `SIZE` allocated on any GPU (e.g. 2GiB), naming it; memsh test: the per-test limit")
		return func(s *scope.Session) (func(), error) {
			if maxPeak.n == 0 {
				return nil, nil
			}
			b, err := starlib.StartBudget(s.Env(), maxPeak.n, "", nil)
			if err != nil {
				return nil, err
			}
			return b.Stop, nil
		}
	})
}
