package sweep

import "io"

// SetTerminal makes progress bars go to writers for which f is true, until
// restore is called.
func SetTerminal(f func(io.Writer) bool) (restore func()) {
	old := isTerminal
	isTerminal = f
	return func() { isTerminal = old }
}
