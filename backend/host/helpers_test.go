package host

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
	"unsafe"
)

// Host RSS is noisy: the Go runtime, the test framework and the C allocator
// all move it by a few MiB at any time. Every RSS assertion in this package
// allows this much either way; the allocations tested are 8 to 16 times
// larger, so a result within tolerance cannot be an accident.
const tolerance = 16 << 20

const (
	kib = 1 << 10
	mib = 1 << 20
)

// settle makes the Go heap small and returned to the OS so it does not drift
// during a measurement.
func settle() {
	runtime.GC()
	debug.FreeOSMemory()
}

func rss(t testing.TB) uint64 {
	t.Helper()
	r, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// touch writes one byte in every page of b, making it resident.
func touch(b []byte) {
	step := int(pageSize)
	for i := 0; i < len(b); i += step {
		b[i] = 1
	}
}

// near fails unless got is within tolerance of want.
func near(t *testing.T, what string, got, want uint64) {
	t.Helper()
	d := int64(got) - int64(want)
	if d < -tolerance || d > tolerance {
		t.Errorf("%s = %.1f MiB, want %.1f MiB ± %d MiB (off by %+.1f MiB)",
			what, mibs(got), mibs(want), tolerance>>20, float64(d)/mib)
	}
}

func mibs(n uint64) float64 { return float64(n) / mib }

// transient allocates size bytes through a, makes them resident, keeps them
// for hold and frees them.
func transient(t *testing.T, a *Allocator, size uint64, hold time.Duration) {
	t.Helper()
	b, err := a.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	touch(b.Host)
	if hold > 0 {
		time.Sleep(hold)
	}
	a.Free(b)
}
func unsafePtr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
