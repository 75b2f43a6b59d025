package tensor

import (
	"errors"
	"fmt"
	"slices"

	"github.com/memsh/memsh/backend"
)

// A Tensor is a strided view of elements of one dtype in a Storage: the
// element at index (i0, i1, ...) is at element offset
// Offset() + Σ i_d·Strides()[d] of the storage. Views (Select, Narrow, View,
// Transpose, Permute, Expand, ...) share their base's Storage; ops that
// allocate make a new contiguous Storage through the Context's Manager.
//
// A Tensor is immutable apart from its values: ops never change a
// tensor's shape, strides, dtype or storage. New fields (autograd's) may
// be added; code outside the package makes tensors only through ops.
type Tensor struct {
	ctx     *Context
	st      *Storage
	mem     *backend.Memory // st.mem, for the kernels' brevity
	dtype   DType
	shape   []int
	strides []int // in elements
	offset  int   // in elements
	view    bool  // created as a view of another tensor

	// Binding is free for the layer above (the Starlark binding keeps its
	// value for the tensor here, so that one engine tensor always yields
	// the same value). The engine never reads it.
	Binding any

	ag *AutogradMeta // autograd state (autograd_meta.go), nil if none

	// mark is where reach walks met the tensor (Reacher.Visit), so that
	// a parameter met through its module, its optimizer and its
	// AccumulateGrad node is walked once.
	mark backend.Mark
	// memoed: a Frontier walk reached it (tensor.Reacher.Frontier); a
	// change of its autograd state or storage then moves ReachShape
	memoed bool
}

// newTensorOn makes a tensor over mem with a new Storage.
func newTensorOn(c *Context, mem *backend.Memory, dt DType, shape, strides []int, offset int) *Tensor {
	return &Tensor{ctx: c, st: newStorage(mem), mem: mem, dtype: dt, shape: shape, strides: strides, offset: offset}
}

// Context returns the Context the tensor was made in.
func (t *Tensor) Context() *Context { return t.ctx }

// Storage returns the storage, shared by views.
func (t *Tensor) Storage() *Storage { return t.st }

// Memory returns the storage's memory (what the tensor keeps alive).
func (t *Tensor) Memory() *backend.Memory { return t.mem }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Strides returns a copy of the strides, in elements.
func (t *Tensor) Strides() []int { return slices.Clone(t.strides) }

// Offset returns the storage offset of element 0, in elements.
func (t *Tensor) Offset() int { return t.offset }

// Dim is the number of dimensions.
func (t *Tensor) Dim() int { return len(t.shape) }

// Device returns the canonical device string ("cpu", "cuda:0").
func (t *Tensor) Device() string { return t.mem.Device() }

// Numel is the number of elements.
func (t *Tensor) Numel() int { return numel(t.shape) }

// NBytes is Numel × the element size in bytes, as PyTorch's
// Tensor.nbytes (not the storage's size).
func (t *Tensor) NBytes() int { return t.Numel() * t.dtype.Size() }

// IsView reports whether t was created as a view of another tensor.
func (t *Tensor) IsView() bool { return t.view }

// IsContiguous reports whether the elements are laid out row-major
// without gaps.
func (t *Tensor) IsContiguous() bool { return t.isContiguous() }

// DataPtr is the address of element 0 (device or host address).
func (t *Tensor) DataPtr() uint64 { return uint64(t.mem.Ptr()) + uint64(t.offset*t.dtype.Size()) }

// Version is the storage's version counter (see Storage).
func (t *Tensor) Version() uint64 { return t.st.version }

// IsMeta reports whether t lives on a meta device (a simulated GPU that
// stores no values).
func (t *Tensor) IsMeta() bool { return t.isMeta() }

// HasData reports whether the values are host-accessible (false on a meta
// device and on a real GPU).
func (t *Tensor) HasData() bool { return t.hasData() }

// Err returns why the tensor's memory was released, or nil while it is
// live.
func (t *Tensor) Err() error { return t.mem.Err() }

// An Error is an op's error: "tensor.add: message". Op names the op as the
// Starlark binding does ("tensor.add"); a binding that exposes the op
// under another name renames it with Renamed.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// errorf makes an op's error (format may use %w).
func errorf(op, format string, args ...any) error {
	return &Error{Op: op, Err: fmt.Errorf(format, args...)}
}

// Renamed returns err with its op renamed to op when err is an op's
// *Error, else err unchanged.
func Renamed(err error, op string) error {
	var e *Error
	if err == nil || !errors.As(err, &e) || e != err {
		return err
	}
	return &Error{Op: op, Err: e.Err}
}

func numel(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// contiguousStrides returns row-major strides for shape.
func contiguousStrides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for d := len(shape) - 1; d >= 0; d-- {
		st[d] = s
		s *= max(shape[d], 1)
	}
	return st
}

// ContiguousStrides returns the row-major strides of shape, in elements.
func ContiguousStrides(shape []int) []int { return contiguousStrides(shape) }

// isContiguous reports whether the elements are laid out row-major without
// gaps (strides of size-1 dimensions do not matter).
func (t *Tensor) isContiguous() bool {
	s := 1
	for d := len(t.shape) - 1; d >= 0; d-- {
		if t.shape[d] == 1 {
			continue
		}
		if t.shape[d] == 0 {
			return true
		}
		if t.strides[d] != s {
			return false
		}
		s *= t.shape[d]
	}
	return true
}

// viewOf returns a view of t with the given layout (sharing t's storage).
func (t *Tensor) viewOf(shape, strides []int, offset int) *Tensor {
	return &Tensor{ctx: t.ctx, st: t.st, mem: t.mem, dtype: t.dtype, shape: shape, strides: strides, offset: offset, view: true}
}

// checkLive returns an error naming the op if the tensor's memory was
// released (for instance when an experiment finished).
func (t *Tensor) checkLive(fname string) error {
	if err := t.mem.Err(); err != nil {
		return errorf(fname, "%w", err)
	}
	if t.mem.Deferred() && (t.ctx == nil || t.ctx.MetaInit == 0) {
		// outside tensor.meta_device an op would compute with no values
		return errorf(fname, "a tensor made on the meta device (tensor.meta_device) has no memory: materialize it first (Module.to_empty)")
	}
	return nil
}

// checkView is checkLive for an op that makes a view: a tensor on the
// meta device (no memory yet) has views, as PyTorch's meta tensors do.
func (t *Tensor) checkView(fname string) error {
	if err := t.mem.Err(); err != nil {
		return errorf(fname, "%w", err)
	}
	return nil
}

// CheckLive returns "op: <release reason>" when t's memory was released.
func (t *Tensor) CheckLive(op string) error { return t.checkLive(op) }

// hasData reports whether the tensor's values are stored where the CPU
// kernels can reach them (false on a meta device).
func (t *Tensor) hasData() bool { return t.mem.HostAccessible() }

// needData returns an error unless the tensor is live and its values can be
// read.
func (t *Tensor) needData(fname string) error {
	if err := t.checkLive(fname); err != nil {
		return err
	}
	if !t.hasData() {
		return noDataError(t.ctx, fname, t.mem.Device())
	}
	return nil
}

func noDataError(c *Context, fname, device string) error {
	if !isMetaDevice(c, device) {
		return errorf(fname, "device %s: values are not host-accessible", device)
	}
	return errorf(fname, "device %s is meta: values are not stored", device)
}

// deviceIsMeta reports whether device is a simulated GPU in meta mode: a
// device that stores no values.
func deviceIsMeta(c *Context, device string) bool {
	a, err := c.Manager.Allocator(device)
	if err != nil {
		return false
	}
	m, ok := a.Device().(interface{ Meta() bool })
	return ok && m.Meta()
}

// isMetaDevice reports whether device is a simulated GPU in meta mode, or
// the meta host of such a session (memory that stores no values; a real
// GPU's memory is not host-accessible either, but it holds values).
func isMetaDevice(c *Context, device string) bool {
	a, err := c.Manager.Allocator(device)
	if err != nil {
		return false
	}
	m, ok := a.Device().(interface{ Meta() bool })
	return a.Device().Kind() == "sim" || (ok && m.Meta())
}

// isMeta reports whether t lives on a meta device.
func (t *Tensor) isMeta() bool {
	return !t.hasData() && (t.mem.Deferred() || isMetaDevice(t.ctx, t.mem.Device()))
}

// String returns the PyTorch-style representation (see format.go); a
// real GPU's values are copied to the host for it.
func (t *Tensor) String() string {
	if s, ok := gpuString(t); ok { // gpu_dispatch.go: real GPUs
		return s
	}
	return formatTensor(t)
}
