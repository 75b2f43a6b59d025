package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const budgetScript = `x = tensor.zeros([1024, 1024], device="cuda")
def f():
    e = experiment("big", quiet=True)
    y = tensor.zeros([4096, 1024], device="cuda")
    e.finish()
f()
budget(8 * MiB)
z = tensor.zeros([3, 1024, 1024], device="cuda")
print("done")
`

// --max-peak and budget(): the run completes, each new high over a limit
// is reported with the experiment or statement, and the exit status is 3.
func TestBudget(t *testing.T) {
	script := filepath.Join(t.TempDir(), "b.star")
	if err := os.WriteFile(script, []byte(budgetScript), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	rc := run([]string{"--device", "sim:1GiB", "--max-peak", "10MiB", script}, strings.NewReader(""), &out, &errb)
	want := "memsh: memory budget exceeded: experiment \"big\" (" + script + ":6): cuda:0 peak allocated 20.00 MiB exceeds the budget of 10.00 MiB\n" +
		"memsh: memory budget exceeded: " + script + ":8: cuda:0 peak allocated 16.00 MiB exceeds the budget of 8.00 MiB\n"
	if rc != exitBudget || out.String() != "done\n" || errb.String() != want {
		t.Errorf("rc %d\nstdout %q\nstderr %q\nwant   %q", rc, out.String(), errb.String(), want)
	}
	out.Reset()
	errb.Reset()
	if rc := run([]string{"--device", "sim:1GiB", "--max-peak", "1GiB", script}, strings.NewReader(""), &out, &errb); rc != exitBudget || strings.Contains(errb.String(), "10.00 MiB") {
		t.Errorf("budget() alone: rc %d stderr %q", rc, errb.String())
	}
	if rc := run([]string{"--device", "sim:1GiB", "-c", "x = tensor.zeros([1024], device='cuda')", "--max-peak", "1GiB"}, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Errorf("within budget: rc %d", rc)
	}
	if rc := run([]string{"--max-peak", "lots", "-c", "1"}, strings.NewReader(""), &out, &errb); rc != 2 {
		t.Errorf("bad size: rc %d", rc)
	}
}

const testFile = `# max-peak: 64MiB

def helper():
    return tensor.zeros([1024, 1024], device="cuda")

def test_small():
    x = helper()
    y = x + 1

# max-peak: 1MiB
def test_too_big():
    x = helper()

def test_error():
    x = helper()
    print("about to fail")
    1 // 0
`

func TestTestCommand(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test_a.star"), []byte(testFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "helper.star"), []byte("def test_not_collected(): fail('ran')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	rc := run([]string{"--device", "sim:1GiB", "test", dir}, strings.NewReader(""), &out, &errb)
	got := out.String()
	for _, want := range []string{
		"PASS test_small (peak 8.00 MiB)\n",
		"FAIL test_too_big (peak 4.00 MiB > max-peak 1.00 MiB)\n",
		"FAIL test_error (peak 4.00 MiB)\n    about to fail\n    Traceback (most recent call last):\n",
		"test_a.star:17:7: in test_error\n",
		"1 passed, 2 failed\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if rc != 1 || strings.Contains(got, "not_collected") {
		t.Errorf("rc %d\n%s", rc, got)
	}
	// --max-peak is the default limit; the file's comment overrides it.
	ok := filepath.Join(dir, "ok")
	if err := os.Mkdir(ok, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ok, "m.star"), []byte("def test_a():\n    x = tensor.zeros([1024, 1024], device='cuda')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if rc := run([]string{"--device", "sim:1GiB", "test", "--max-peak", "8MiB", ok}, strings.NewReader(""), &out, &errb); rc != 0 || out.String() != "PASS test_a (peak 4.00 MiB)\n1 passed, 0 failed\n" {
		t.Errorf("rc %d\n%s", rc, out.String())
	}
	out.Reset()
	if rc := run([]string{"--device", "sim:1GiB", "--max-peak", "1MiB", "test", ok}, strings.NewReader(""), &out, &errb); rc != 1 || !strings.Contains(out.String(), "0 passed, 1 failed") {
		t.Errorf("rc %d\n%s", rc, out.String())
	}
}
