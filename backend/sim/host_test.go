package sim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/memsh/memsh/backend"
)

// TestHostExhaustedInjected: an mmap failure while backing a data device is
// "host memory exhausted while backing simulated device cuda:0 (N bytes)",
// not the device's ErrDeviceFull, and the caching allocator does not turn it
// into a CUDA out-of-memory error.
func TestHostExhaustedInjected(t *testing.T) {
	old := mapPages
	mapPages = func(uint64) ([]byte, error) { return nil, syscall.ENOMEM }
	defer func() { mapPages = old }()
	sp, _ := ParseSpec("16GiB")
	d := New(sp)[0]
	_, err := d.Malloc(1 << 30)
	want := "host memory exhausted while backing simulated device cuda:0 (1073741824 bytes)"
	if err == nil || !strings.HasPrefix(err.Error(), want) || errors.Is(err, backend.ErrDeviceFull) {
		t.Fatalf("Malloc: %v; want %q, not ErrDeviceFull", err, want)
	}
	if d.Used() != 0 {
		t.Errorf("used %d after a failed malloc", d.Used())
	}
	a := backend.NewCachingAllocator(d, 0)
	_, err = a.Malloc(1 << 30)
	if err == nil || backend.IsOOM(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("allocator: %v; want %q and not an OOM", err, want)
	}
	var he *HostExhaustedError
	if !errors.As(err, &he) || he.Device != "cuda:0" || he.Size != 1<<30 {
		t.Errorf("errors.As: %+v", he)
	}
}

// TestHostExhaustedReal runs a simulator larger than the host's RAM in a
// child process whose address space is limited (RLIMIT_AS), so the mmap
// backing a large allocation really fails.
func TestHostExhaustedReal(t *testing.T) {
	if os.Getenv("MEMSH_SIM_RLIMIT_CHILD") == "1" {
		childExhaust()
		return
	}
	total, ok := hostMemTotal()
	if !ok {
		t.Fatal("cannot read MemTotal")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostExhaustedReal$")
	cmd.Env = append(os.Environ(), "MEMSH_SIM_RLIMIT_CHILD=1", fmt.Sprintf("MEMSH_SIM_HOST_TOTAL=%d", total))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "CHILD OK") {
		t.Fatalf("child did not check:\n%s", out)
	}
	t.Logf("%s", out)
}

func childExhaust() {
	total, _ := strconv.ParseUint(os.Getenv("MEMSH_SIM_HOST_TOTAL"), 10, 64)
	capacity := (total + (1 << 30)) &^ (1<<30 - 1) * 2 // twice the host's RAM
	sp := Spec{Count: 1, Total: capacity}
	if w := HostBackingWarning(sp); !strings.Contains(w, "more than this machine's") {
		fmt.Println("no warning for", sp, ":", w)
		os.Exit(1)
	}
	// Limit the address space to what the process has plus 1 GiB.
	status, _ := os.ReadFile("/proc/self/status")
	var vm uint64
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmSize:"); ok {
			kb, _ := strconv.ParseUint(strings.Fields(rest)[0], 10, 64)
			vm = kb << 10
		}
	}
	lim := syscall.Rlimit{Cur: vm + 1<<30, Max: vm + 1<<30}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &lim); err != nil {
		fmt.Println("setrlimit:", err)
		os.Exit(1)
	}
	d := New(sp)[0]
	size := total // more than the limit leaves, less than the capacity
	_, err := d.Malloc(size)
	want := fmt.Sprintf("host memory exhausted while backing simulated device cuda:0 (%d bytes)", size)
	if err == nil || !strings.HasPrefix(err.Error(), want) || errors.Is(err, backend.ErrDeviceFull) {
		fmt.Printf("Malloc(%d) on %s: %v; want %q\n", size, sp, err, want)
		os.Exit(1)
	}
	fmt.Println("CHILD OK:", err)
}

func TestHostBackingWarning(t *testing.T) {
	old := hostMemTotal
	hostMemTotal = func() (uint64, bool) { return 24 << 30, true }
	defer func() { hostMemTotal = old }()
	for _, tc := range []struct{ spec, want string }{
		{"16GiB", ""},
		{"80GiB,meta", ""},
		{"80GiB", "warning: a simulated GPU of 80.00 GiB with data needs up to 80.00 GiB of host memory to back it, more than this machine's 24.00 GiB; filling it fails with \"host memory exhausted\" (or the kernel's OOM killer ends memsh); use sim:80GiB,meta to simulate sizes only"},
		{"2x16GiB,ctx=1GiB", "warning: 2 simulated GPUs of 16.00 GiB with data needs up to 30.00 GiB of host memory"},
	} {
		sp, err := ParseSpec(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		got := HostBackingWarning(sp)
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q; want %q", tc.spec, got, tc.want)
		}
	}
}

func TestSpecNumbers(t *testing.T) {
	for spec, want := range map[string]string{
		"NaNGiB":                `sim spec "NaNGiB": bad capacity "NaNGiB" (want a size such as 16GiB; got nan, want a finite number)`,
		"infGiB":                `sim spec "infGiB": bad capacity "infGiB" (want a size such as 16GiB; got inf, want a finite number)`,
		"-1GiB":                 `sim spec "-1GiB": bad capacity "-1GiB" (want a size such as 16GiB; negative)`,
		"1000000000000GiB":      `sim spec "1000000000000GiB": bad capacity "1000000000000GiB" (want a size such as 16GiB; too large (max 2^63-1 bytes))`,
		"18446744073709551615B": `sim spec "18446744073709551615B": bad capacity "18446744073709551615B" (want a size such as 16GiB; 18446744073709551615 bytes is too large (max 2^63-1 bytes))`,
		"16GiB,ctx=nanMiB":      `sim spec "16GiB,ctx=nanMiB": bad context size "nanMiB" (want a size such as 300MiB; got nan, want a finite number)`,
		"16":                    `sim spec "16": bad capacity "16" (want a size such as 16GiB; no unit)`,
	} {
		_, err := ParseSpec(spec)
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v\nwant %s", spec, err, want)
		}
	}
}
