package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Under an address-space limit (prlimit --as=4000000000; here `ulimit -v`
// in sh, which sets the same RLIMIT_AS), every way a script can ask the
// Go heap for more than is left ends in a Starlark error naming the
// built-in or operator and the size, exit 1 — never the Go runtime's
// fatal out-of-memory and its goroutine dump. Each case crashed at
// 42a6389.
func TestHostMemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs memsh under ulimit -v")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	bin := buildMemsh(t, "")
	dir := t.TempDir()
	big := filepath.Join(dir, "big.star")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3_000_000_000); err != nil { // sparse: no disk used
		t.Skip(err)
	}
	f.Close()
	write(t, filepath.Join(dir, "loadbig.star"), "load('big.star', 'x')\n")
	// The cases under --as=4000000000; the loops that grow a
	// value step by step under a tighter limit, reached sooner.
	const as4e9, tight = 3906250, 2400000 // KiB, as ulimit -v takes it
	cases := []struct {
		code, want string
		kib        int
	}{
		{`x = tensor.ones([1 << 26]).tolist()`, "tensor.tolist: converting 67108864 elements needs about", as4e9},
		{`x = list(range(1000000000))`, "list: needs about", as4e9},
		{`x = ((),) * 177777771`, "repeat (1 * 177777771 elements): needs about", as4e9},
		{`x = tuple(range(1000000000))`, "tuple: needs about", as4e9},
		{`x = sorted(range(1000000000))`, "sorted: needs about", as4e9},
		{`x = list(reversed(range(1000000000)))`, "reversed: needs about", as4e9},
		{"x = 'a' * 1000000000\ny = x + x + x", "+: needs about", as4e9},
		{"", "larger than a script may be (64 MiB)", as4e9}, // load() of a 3 GB file
		{`x = [i for i in range(1000000000)]`, "append: needs about", tight},
		{"l = []\nfor i in range(1000000000):\n    l.append(i)", "append: needs about", tight},
		{"l = []\nfor i in range(1000000000):\n    l += [i]", "extend: needs about", tight},
		{`x = {i: i for i in range(100000000)}`, "dict or set: needs about", tight},
		{`x = ",".join(["abcdefghabcdefgh"] * 20000000)`, "join: needs about", tight},
		{`s = str([[1] * 1000] * 200000)`, "str: needs about", tight},
	}
	for _, tc := range cases {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			args := []string{"--device", "sim:16GiB", "-c", tc.code}
			if tc.code == "" {
				args = []string{"--device", "sim:16GiB", filepath.Join(dir, "loadbig.star")}
			}
			cmd := exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -v %d && exec "$0" "$@"`, tc.kib), bin}, args...)...)
			cmd.Dir = dir
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			rc := 0
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			}
			msg := stderr.String()
			if rc != 1 || !strings.Contains(msg, tc.want) || strings.Contains(msg, "goroutine ") || strings.Contains(msg, "fatal error") {
				if len(msg) > 600 {
					msg = msg[:600] + "..."
				}
				t.Errorf("%q under ulimit -v %d: exit %d, stderr:\n%s\nwant exit 1 and %q", tc.code, tc.kib, rc, msg, tc.want)
			}
		})
	}
}
