package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/memsh/memsh/internal/textdiff"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts in testdata/cli")

// versionLine is --version's output with its variable parts.
var versionLine = regexp.MustCompile(`(?m)^memsh \S+ commit \S+ go\S+ \S+/\S+$`)

// TestGolden compares whole transcripts (exit status, stdout, stderr) with
// the files in testdata/cli; go test ./cmd/memsh -run Golden -update
// rewrites them.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
	}{
		{"help", []string{"--help"}, ""},
		{"version", []string{"--version"}, ""},
		{"piped_script", []string{"--device", "sim:1GiB"}, "def f(n):\n    x = tensor.zeros([n], device='cuda')\n\n    return x.nbytes\n\nprint(f(1024), argv)\n"},
		{"piped_error", []string{"--device", "sim:1GiB", "-"}, "x = 1\ny = x // 0\n"},
		{"oom", []string{"--device", "sim:1GiB,ctx=100MiB"}, "x = tensor.zeros([64, 1024, 1024], device='cuda')\ny = tensor.zeros([256, 1024, 1024], device='cuda')\n"},
		{"devices_presets", []string{"devices", "--presets"}, ""},
		{"preset_device", []string{"--device", "sim:2xH100,meta", "-c", "print(cuda.get_device_name(), cuda.device_count(), cuda.mem_get_info())"}, ""},
		{"log_stderr", []string{"--device", "sim:1GiB", "--log=compact", "-c", "print(1)"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(tc.args, strings.NewReader(tc.stdin), &out, &errb)
			got := fmt.Sprintf("$ memsh %s\nexit status %d\n--- stdout\n%s--- stderr\n%s", strings.Join(tc.args, " "), rc, out.String(), errb.String())
			got = versionLine.ReplaceAllString(got, "memsh VERSION commit COMMIT GOVERSION GOOS/GOARCH")
			got = regexp.MustCompile(`Time \d+:\d+:\d+\.\d+ \| CPU \d+%/\d+%`).ReplaceAllString(got, "Time T | CPU C")
			got = regexp.MustCompile(`host: [^|]*\|`).ReplaceAllString(got, "host: H |")
			checkGolden(t, filepath.Join("testdata", "cli", tc.name+".golden"), got)
		})
	}
}

// checkGolden compares got with the golden file at path (-update
// rewrites it) and names the first line that differs.
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got == string(want) {
		return
	}
	n, g, w, _ := textdiff.FirstLine(got, string(want))
	t.Errorf("output differs from %s at line %d:\n got: %q\nwant: %q\n--- got\n%s--- want\n%s", path, n, g, w, got, want)
}
