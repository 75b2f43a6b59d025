package scope_test

import (
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/scope"
)

// FuzzExec runs arbitrary source in a Session on a small simulated GPU
// (meta: no data) with a step budget, so every loop ends. Invariants: no
// panic; the Session stays usable after any error (a follow-up statement
// runs); and once the open experiments are finished, the user globals are
// cleared and memory is reclaimed, nothing is left allocated on the GPU.
// The seed corpus (testdata/fuzz/FuzzExec) runs with `go test`.
func FuzzExec(f *testing.F) {
	f.Add("x = tensor.zeros([4, 4], device='cuda')\ny = x + 1\n")
	// A fuzzed program may ask for host tensors of any size (the default
	// device is the CPU): a sweep that doubles one until it runs out of
	// memory would fill the machine, and the kernel kills the worker,
	// which the fuzzer reports as a crash (testdata/fuzz/FuzzExec/
	// 27040247e17775d0). Past 2 GiB of private mappings more than the
	// process has when the fuzzing starts (RLIMIT_DATA, which counts the
	// mappings host tensors live in, and the Go heap: the tests run before
	// in this process may have left it large) an allocation fails and
	// memsh reports it as host memory exhausted, as it does on a full
	// machine.
	var old syscall.Rlimit
	debug.FreeOSMemory()
	if err := syscall.Getrlimit(syscall.RLIMIT_DATA, &old); err == nil {
		lim := old
		lim.Cur = vmData() + 2<<30
		if lim.Cur < old.Cur {
			if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &lim); err == nil {
				defer syscall.Setrlimit(syscall.RLIMIT_DATA, &old)
			}
		}
	}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 4096 {
			return
		}
		s, err := scope.New(scope.Options{Device: "sim:64MiB,meta", Out: io.Discard, Err: io.Discard, Quiet: true, MaxSteps: 20000})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// cuda.dump_snapshot may only write to a scratch directory.
		s.Env().Files = &fsafe.Policy{Roots: []string{t.TempDir()}}

		if err := s.Exec("fuzz.star", src); err != nil {
			if strings.Contains(err.Error(), "freed as unreachable") {
				t.Fatalf("a reclaim freed memory still in use: %v\n%s", err, src)
			}
			if testing.Verbose() {
				t.Logf("%v", err)
			}
		}
		if err := s.Exec("after.star", "x = 1"); err != nil {
			t.Fatalf("session unusable after %q: %v", src, err)
		}
		if v := s.Get("x"); v == nil || v.String() != "1" {
			t.Fatalf("x = %v after the follow-up statement", v)
		}

		s.FinishOpen(nil)
		for name := range s.Globals() {
			s.Set(name, starlark.None)
		}
		s.Manager().Reclaim()
		for i := 0; i < s.Manager().NumGPUs(); i++ {
			if n := s.Manager().GPU(i).Allocated(); n != 0 {
				t.Fatalf("cuda:%d: %d bytes still allocated after clearing the globals of %q", i, n, src)
			}
		}
	})
}

// vmData is the process's private data mappings now (VmData, the size
// RLIMIT_DATA bounds), in bytes; 0 when /proc says nothing.
func vmData() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmData:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
