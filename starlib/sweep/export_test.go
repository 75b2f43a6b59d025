package sweep

import "io"

// SetTerminal makes progress bars go to writers for which f is true, until
// restore is called.
func SetTerminal(f func(io.Writer) bool) (restore func()) {
	old := isTerminal
	isTerminal = f
	return func() { isTerminal = old }
}

// ShowReplayFields makes every sweep's points show their replay fields
// (replayed, reserved), until restore is called.
func ShowReplayFields() (restore func()) {
	old := showReplayFields
	showReplayFields = true
	return func() { showReplayFields = old }
}
