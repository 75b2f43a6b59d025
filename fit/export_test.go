package fit

// SetAdviceWorkers sets how many of the advice's searches run at once
// (0: GOMAXPROCS) and returns a function that restores the previous value.
func SetAdviceWorkers(n int) (restore func()) {
	prev := adviceWorkers
	adviceWorkers = n
	return func() { adviceWorkers = prev }
}
