package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMemshProcess is not a test: run as a subprocess with
// MEMSH_TEST_PROCESS=1, it is memsh with the arguments after "--".
func TestMemshProcess(t *testing.T) {
	if os.Getenv("MEMSH_TEST_PROCESS") != "1" {
		t.Skip("helper process")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(run(args, os.Stdin, os.Stdout, os.Stderr))
}

// Ctrl-C (SIGINT) to `memsh -c` running a large matrix product stops the
// product (it checks between panels) and memsh exits 130 promptly, not
// after the product.
func TestSIGINTStopsMatmul(t *testing.T) {
	if testing.Short() {
		t.Skip("large matrix product")
	}
	code := "a = tensor.ones([4096, 4096])\nprint('started')\nfor i in range(100):\n    c = a.matmul(a)\n"
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemshProcess$", "--", "--device", "sim:1GiB", "-c", code)
	cmd.Env = append(os.Environ(), "MEMSH_TEST_PROCESS=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}
	time.Sleep(200 * time.Millisecond) // inside the product by then
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("memsh still running 30 s after SIGINT")
	}
	lat := time.Since(sent)
	rc := cmd.ProcessState.ExitCode()
	t.Logf("SIGINT to exit: %v (rc %d)", lat.Round(time.Millisecond), rc)
	if rc != 130 || !strings.Contains(errb.String(), "interrupted") {
		t.Errorf("rc = %d (err %v), stderr:\n%s", rc, err, errb.String())
	}
	if lat > 2*time.Second { // the aim is 100 ms plus exit; generous for CI
		t.Errorf("memsh took %v to exit after SIGINT", lat)
	}
}
