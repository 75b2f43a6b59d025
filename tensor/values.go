package tensor

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
)

// Reading values. These copy a real GPU's values to the host first and
// fail on a meta device ("tensor.item: device cuda:0 is meta: values are
// not stored") and on released memory.

// NeedData returns "op: ..." unless t is live and its values can be read
// (directly or, on a real GPU, through a host copy).
func (t *Tensor) NeedData(op string) error {
	if onGPU(t) != nil {
		return t.checkLive(op)
	}
	return t.needData(op)
}

// Item is Tensor.item: the value of a one-element tensor.
func (t *Tensor) Item() (Scalar, error) {
	const fname = "tensor.item"
	if onGPU(t) != nil {
		var v Scalar
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			v, err = item(fname, s.shadowOf(t))
			return err
		})
		return v, err
	}
	return item(fname, t)
}

// Values returns the elements in row-major order (Tensor.tolist,
// flattened), each a Scalar of t's dtype.
func (t *Tensor) Values() ([]Scalar, error) {
	const fname = "tensor.tolist"
	if err := CheckConversion(fname, t.Numel(), ScalarBytes); err != nil {
		return nil, err
	}
	if onGPU(t) != nil {
		var v []Scalar
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			v, err = values(fname, s.shadowOf(t))
			return err
		})
		return v, err
	}
	return values(fname, t)
}

// ToFloat64s returns the elements in row-major order as float64s.
func (t *Tensor) ToFloat64s() ([]float64, error) {
	if err := CheckConversion("tensor.values", t.Numel(), ScalarBytes+8); err != nil {
		return nil, err
	}
	vs, err := t.Values()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = v.f
	}
	return out, nil
}

// Contains reports whether some element equals x (Python's "x in t").
func Contains(t *Tensor, x Scalar) (bool, error) {
	const fname = "tensor.__contains__"
	if onGPU(t) != nil {
		var found bool
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			found, err = contains(fname, s.shadowOf(t), x)
			return err
		})
		return found, err
	}
	return contains(fname, t, x)
}

func contains(fname string, t *Tensor, x Scalar) (bool, error) {
	if err := t.needData(fname); err != nil {
		return false, err
	}
	f := x.f
	found := false
	load := loadF64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		found = load(p) == f
		return !found
	})
	runtime.KeepAlive(t)
	return found, nil
}

// Bounded conversions. Reading a tensor's values into Go (Values, tolist,
// ToFloat64s) takes Go heap in proportion to its elements; a conversion that
// would need more than the process may still take is an error before it
// starts, not a kill by the kernel or the cgroup.

// ScalarBytes is the Go heap one element takes in Values' result.
const ScalarBytes = uint64(unsafe.Sizeof(Scalar{}))

// AvailableMemory returns the memory the process may still take (host
// MemAvailable capped by the memory cgroup's room and the address-space
// and data-segment limits: host.Allowance; 0 when unknown). A variable
// so that tests can inject a figure.
var AvailableMemory = host.Allowance

// CheckConversion returns an error naming fname when converting n elements
// at perElem bytes of Go heap each needs more memory than AvailableMemory
// reports ("tensor.tolist: converting 67108864 elements needs about 2.50 GiB
// of memory; 1.20 GiB is available"). Conversions below 1 MiB, and any when
// the available memory cannot be read, are not checked.
func CheckConversion(fname string, n int, perElem uint64) error {
	if n <= 0 {
		return nil
	}
	need := uint64(n) * perElem
	if perElem != 0 && need/perElem != uint64(n) {
		need = 1<<63 - 1 // overflow
	}
	if need < 1<<20 {
		return nil
	}
	avail := AvailableMemory()
	if avail == 0 || need <= avail {
		return nil
	}
	return fmt.Errorf("%s: converting %d elements needs about %s of memory; %s is available", fname, n, backend.FormatBytes(int64(min(need, 1<<63-1))), backend.FormatBytes(int64(min(avail, 1<<63-1))))
}
