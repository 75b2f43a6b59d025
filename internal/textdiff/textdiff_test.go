package textdiff

import "testing"

func TestFirstLine(t *testing.T) {
	for _, tc := range []struct {
		got, want string
		n         int
		g, w      string
		ok        bool
	}{
		{"a\nb\n", "a\nb\n", 0, "", "", false},
		{"a\nb\n", "a\nc\n", 2, "b", "c", true},
		{"a\nb", "a", 2, "b", "", true},
		{"a", "a\nb", 2, "", "b", true},
		{"a\n", "a", 0, "", "", false},
	} {
		n, g, w, ok := FirstLine(tc.got, tc.want)
		if n != tc.n || g != tc.g || w != tc.w || ok != tc.ok {
			t.Errorf("FirstLine(%q, %q) = %d, %q, %q, %v; want %d, %q, %q, %v", tc.got, tc.want, n, g, w, ok, tc.n, tc.g, tc.w, tc.ok)
		}
	}
}
