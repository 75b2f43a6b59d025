package report

import (
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/env/refpath"
)

// holder is one value that owns memory (a tensor, a buffer), with the
// shortest reference path that reaches it.
type holder struct {
	value env.Holder
	path  string
}

// holders returns every holder value reachable from roots, in the order
// refpath's breadth-first walk reaches them, and again for each further
// path that reaches the same value (a tied weight). A report needs every
// tensor, views sharing an allocation included.
func holders(roots []refpath.Root) []holder {
	var out []holder
	refpath.HoldersAll(roots, func(h env.Holder, path string) bool {
		out = append(out, holder{value: h, path: path})
		return true
	})
	return out
}
