// Package textdiff finds where two texts differ, for tests that compare
// output with a golden copy.
package textdiff

import "strings"

// FirstLine returns the number (from 1) of the first line where got and
// want differ, and those two lines ("" past a text's end). ok is false
// when every line agrees: the texts are equal, or differ only by a
// trailing newline.
func FirstLine(got, want string) (n int, g, w string, ok bool) {
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(gl), len(wl)) {
		g, w = "", ""
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			return i + 1, g, w, true
		}
	}
	return 0, "", "", false
}
