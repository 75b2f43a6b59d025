package cuda_test

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
)

// Sums on one device from several goroutines share the device's workspace:
// each must still get its own total (Device is safe for concurrent use).
func TestConcurrentSum(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{NoCtx: true, NoPoison: true})
	drv, err := cuda.Open(s.LibCUDA)
	if err != nil {
		t.Fatal(err)
	}
	d := drv.Devices()[0]
	const n = 1 << 16
	bufs := make([]uintptr, 2)
	for g := range 2 {
		m, err := d.Malloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		bufs[g] = m.Ptr
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(g + 1)
		}
		if err := d.CopyHtoD(m.Ptr, unsafe.Pointer(&v[0]), 4*n); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				s, err := d.Sum(cuda.F32, bufs[g], n)
				if err != nil {
					t.Error(err)
					return
				}
				if s != float64((g+1)*n) {
					t.Errorf("goroutine %d: Sum = %v, want %v", g, s, (g+1)*n)
					return
				}
			}
		}()
	}
	wg.Wait()
}
