package tensor

import (
	"fmt"
	"runtime"
	"slices"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// A Tensor is the Starlark value of type "tensor": a strided view of
// elements of one dtype stored in a *backend.Memory owned by the Session's
// Manager. Views (indexing, slicing, view, transpose, ...) share their
// base's Memory; the memory is freed by the Manager's next reclaim once no
// tensor refers to it.
//
// Value semantics, where Starlark differs from Python:
//   - a tensor is unhashable; == and != compare identity (they must give
//     a bool in Starlark) and < <= > >= are errors: the elementwise
//     comparisons are the methods eq ne lt le gt ge (ops_compare.go);
//   - truth is "has at least one element" (PyTorch raises for
//     multi-element tensors; Starlark's truth test cannot fail);
//   - len(t) is t.shape[0], 0 for a 0-dim tensor;
//   - t[i], t[i, j, ...] (ints only) and t[a:b:c] (along dim 0, negative
//     steps allowed as in NumPy; slicing a 0-dim tensor gives a view of it,
//     as Starlark's slice operator cannot fail) are views; t[i] = v and
//     t[i, j] = v assign a number or a broadcastable tensor;
//   - "x in t" compares the number x with every element.
//
// Attributes: shape (tuple of ints), dtype, device (the canonical device
// string, "cpu" or "cuda:N"), nbytes (numel × itemsize bytes, not the
// storage's size), ndim, is_view, storage_id (the storage's allocation
// sequence number, equal for views of one storage), storage_offset (in
// elements), is_cuda and T (all dimensions reversed, a view).
//   - freezing a tensor does not make its data read-only: tensor data is
//     device memory, outside Starlark's freeze model.
type Tensor struct {
	env     *env.Env        // the Session's state: Manager, RNG
	mem     *backend.Memory // the storage, shared by views
	dtype   DType
	shape   []int
	strides []int // in elements
	offset  int   // in elements
	view    bool  // created as a view of another tensor
}

var (
	_ env.Holder          = (*Tensor)(nil)
	_ starlark.HasAttrs   = (*Tensor)(nil)
	_ starlark.HasBinary  = (*Tensor)(nil)
	_ starlark.HasUnary   = (*Tensor)(nil)
	_ starlark.Sliceable  = (*Tensor)(nil)
	_ starlark.HasSetKey  = (*Tensor)(nil)
	_ starlark.Iterable   = (*Tensor)(nil)
	_ starlark.Container  = (*Tensor)(nil)
	_ starlark.Sequence   = (*Tensor)(nil)
	_ starlark.Indexable  = (*Tensor)(nil)
	_ starlark.Mapping    = (*Tensor)(nil)
	_ starlark.Value      = (*Tensor)(nil)
	_ starlark.Comparable = (*Tensor)(nil)
	_ starlark.Comparable = DType(0)
)

// HeldMemory implements env.Holder: the Memory the tensor (and every view
// of it) keeps alive.
func (t *Tensor) HeldMemory() *backend.Memory { return t.mem }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Device returns the canonical device string ("cpu", "cuda:0").
func (t *Tensor) Device() string { return t.mem.Device() }

// Numel is the number of elements.
func (t *Tensor) Numel() int { return numel(t.shape) }

// NBytes is Numel × the element size, as PyTorch's Tensor.nbytes.
func (t *Tensor) NBytes() int { return t.Numel() * t.dtype.Size() }

// IsView reports whether t was created as a view of another tensor.
func (t *Tensor) IsView() bool { return t.view }

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

// viewOf returns a view of t with the given layout (sharing t's memory).
func (t *Tensor) viewOf(shape, strides []int, offset int) *Tensor {
	return &Tensor{env: t.env, mem: t.mem, dtype: t.dtype, shape: shape, strides: strides, offset: offset, view: true}
}

// checkLive returns an error naming the builtin if the tensor's memory was
// released (for instance when an experiment finished).
func (t *Tensor) checkLive(fname string) error {
	if err := t.mem.Err(); err != nil {
		return fmt.Errorf("%s: %w", fname, err)
	}
	return nil
}

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
		return noDataError(t.env, fname, t.mem.Device())
	}
	return nil
}

func noDataError(e *env.Env, fname, device string) error {
	if !isMetaDevice(e, device) {
		return fmt.Errorf("%s: device %s: values are not host-accessible", fname, device)
	}
	return fmt.Errorf("%s: device %s is meta: values are not stored", fname, device)
}

// deviceIsMeta reports whether device is a simulated GPU in meta mode: a
// device that stores no values.
func deviceIsMeta(e *env.Env, device string) bool {
	a, err := e.Manager.Allocator(device)
	if err != nil {
		return false
	}
	m, ok := a.Device().(interface{ Meta() bool })
	return ok && m.Meta()
}

// isMetaDevice reports whether device is a simulated GPU in meta mode
// (memory that stores no values; a real GPU's memory is not host-accessible
// either, but it holds values).
func isMetaDevice(e *env.Env, device string) bool {
	a, err := e.Manager.Allocator(device)
	return err == nil && a.Device().Kind() == "sim"
}

// isMeta reports whether t lives on a meta device.
func (t *Tensor) isMeta() bool { return !t.hasData() && isMetaDevice(t.env, t.mem.Device()) }

// String returns the PyTorch-style representation (see format.go).
func (t *Tensor) String() string {
	if s, ok := gpuStringHook(t); ok { // gpu_dispatch.go: real GPUs
		return s
	}
	return formatTensor(t)
}

// Type returns "tensor".
func (t *Tensor) Type() string { return "tensor" }

// Freeze does nothing: tensor data is device memory, outside Starlark's
// freeze model (like an open file).
func (t *Tensor) Freeze() {}

// Truth reports whether the tensor has at least one element.
func (t *Tensor) Truth() starlark.Bool { return t.Numel() > 0 }

// Hash fails: tensors are unhashable.
func (t *Tensor) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: tensor") }

// Len is the size of dimension 0 (0 for a 0-dim tensor).
func (t *Tensor) Len() int {
	if len(t.shape) == 0 {
		return 0
	}
	return t.shape[0]
}

// Index returns t[i] (0 <= i < Len()), a view.
func (t *Tensor) Index(i int) starlark.Value { return t.select0(i) }

// select0 is the view t[i] for a valid, non-negative i.
func (t *Tensor) select0(i int) *Tensor {
	return t.viewOf(slices.Clone(t.shape[1:]), slices.Clone(t.strides[1:]), t.offset+i*t.strides[0])
}

// Slice returns t[start:end:step] along dimension 0, a view.
func (t *Tensor) Slice(start, end, step int) starlark.Value {
	if len(t.shape) == 0 {
		return t.viewOf(nil, nil, t.offset) // no dimension to slice
	}
	var n int
	if step > 0 {
		n = max(0, (end-start+step-1)/step)
	} else {
		n = max(0, (start-end-step-1)/(-step))
	}
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	shape[0] = n
	strides[0] *= step
	off := t.offset
	if n > 0 {
		off += start * t.strides[0]
	}
	return t.viewOf(shape, strides, off)
}

// Get implements t[i] and t[i, j, ...] with int indices (negative ones
// count from the end).
func (t *Tensor) Get(k starlark.Value) (starlark.Value, bool, error) {
	v, err := t.index("tensor index", k)
	if err != nil {
		return nil, true, err
	}
	return v, true, nil
}

func (t *Tensor) index(fname string, k starlark.Value) (*Tensor, error) {
	var idx []starlark.Value
	switch k := k.(type) {
	case starlark.Tuple:
		idx = k
	default:
		idx = []starlark.Value{k}
	}
	if len(idx) > len(t.shape) {
		if len(t.shape) == 0 {
			return nil, fmt.Errorf("%s: invalid index of a 0-dim tensor", fname)
		}
		return nil, fmt.Errorf("%s: too many indices for tensor of dimension %d", fname, len(t.shape))
	}
	r := t
	for d, x := range idx {
		xi, ok := x.(starlark.Int)
		if !ok {
			return nil, fmt.Errorf("%s: got %s, want int or tuple of ints", fname, x.Type())
		}
		i, ok := xi.Int64()
		size := r.shape[0]
		if ok && i < 0 {
			i += int64(size)
		}
		if !ok || i < 0 || i >= int64(size) {
			return nil, fmt.Errorf("%s: index %s is out of bounds for dimension %d with size %d", fname, xi, d, size)
		}
		r = r.select0(int(i))
	}
	if r == t {
		r = t.viewOf(slices.Clone(t.shape), slices.Clone(t.strides), t.offset)
	}
	return r, nil
}

// SetKey implements t[i] = v and t[i, j] = v: v is a number (fill) or a
// tensor broadcastable to t[i] (copy). Nothing is allocated.
func (t *Tensor) SetKey(k, v starlark.Value) error {
	const fname = "tensor.__setitem__"
	if ok, err := gpuSetKeyHook(t, k, v); ok {
		return err
	}
	dst, err := t.index(fname, k)
	if err != nil {
		return err
	}
	if src, ok := v.(*Tensor); ok {
		return copyInto(fname, dst, src)
	}
	return fillInto(fname, dst, v)
}

// Iterate yields t[0], t[1], ... (views).
func (t *Tensor) Iterate() starlark.Iterator { return &tensorIter{t: t} }

type tensorIter struct {
	t *Tensor
	i int
}

func (it *tensorIter) Next(p *starlark.Value) bool {
	if it.i >= it.t.Len() {
		return false
	}
	*p = it.t.select0(it.i)
	it.i++
	return true
}

func (it *tensorIter) Done() {}

// Has implements "x in t": whether some element equals the number x.
func (t *Tensor) Has(y starlark.Value) (bool, error) {
	const fname = "tensor.__contains__"
	if found, ok, err := gpuHasHook(t, y); ok {
		return found, err
	}
	f, ok := starlark.AsFloat(y)
	if !ok {
		if b, isBool := y.(starlark.Bool); isBool {
			f, ok = float64(b2i(bool(b))), true
		}
	}
	if !ok {
		return false, fmt.Errorf("%s: got %s, want a number", fname, y.Type())
	}
	if err := t.needData(fname); err != nil {
		return false, err
	}
	found := false
	load := loadF64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		found = load(p) == f
		return !found
	})
	runtime.KeepAlive(t)
	return found, nil
}

// Binary implements + - * / // % between tensors and numbers.
func (t *Tensor) Binary(op syntax.Token, y starlark.Value, side starlark.Side) (starlark.Value, error) {
	var bop binOp
	switch op {
	case syntax.PLUS:
		bop = opAdd
	case syntax.MINUS:
		bop = opSub
	case syntax.STAR:
		bop = opMul
	case syntax.SLASH:
		bop = opDiv
	case syntax.SLASHSLASH:
		bop = opFloorDiv
	case syntax.PERCENT:
		bop = opMod
	default:
		return nil, nil
	}
	other, err := asOperand(y)
	if err == errNotOperand {
		return nil, nil // let Starlark report "unknown binary op"
	} else if err != nil {
		return nil, fmt.Errorf("%s: %v", binOpNames[bop], err)
	}
	if r, ok, err := gpuBinaryHook(t, op, y, side); ok {
		return r, err
	}
	x := operand{t: t}
	if side == starlark.Right {
		return binary(bop, other, x)
	}
	return binary(bop, x, other)
}

// Unary implements -t and +t.
func (t *Tensor) Unary(op syntax.Token) (starlark.Value, error) {
	switch op {
	case syntax.MINUS:
		if r, ok, err := gpuUnaryHook(t, op); ok {
			return r, err
		}
		return unary("tensor.neg", uNeg, t)
	case syntax.PLUS:
		return t, nil
	}
	return nil, nil
}

// Attr returns an attribute or a bound method.
func (t *Tensor) Attr(name string) (starlark.Value, error) {
	switch name {
	case "shape":
		return shapeTuple(t.shape), nil
	case "dtype":
		return t.dtype, nil
	case "device":
		return starlark.String(t.mem.Device()), nil
	case "nbytes":
		return starlark.MakeInt(t.NBytes()), nil
	case "ndim":
		return starlark.MakeInt(len(t.shape)), nil
	case "is_view":
		return starlark.Bool(t.view), nil
	case "storage_id":
		return starlark.MakeUint64(t.mem.Seq()), nil
	case "storage_offset":
		return starlark.MakeInt(t.offset), nil
	case "is_cuda":
		return starlark.Bool(t.mem.Device() != "cpu"), nil
	case "T":
		return transposeAll(t), nil
	}
	if m, ok := methods[name]; ok {
		return starlark.NewBuiltin("tensor."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return m(thread, b.Name(), b.Receiver().(*Tensor), args, kwargs)
		}).BindReceiver(t), nil
	}
	return nil, nil
}

// attrNames is set by init in methods.go.
var attrNames []string

// AttrNames lists the attributes and methods.
func (t *Tensor) AttrNames() []string { return attrNames }

func shapeTuple(shape []int) starlark.Tuple {
	tu := make(starlark.Tuple, len(shape))
	for i, s := range shape {
		tu[i] = starlark.MakeInt(s)
	}
	return tu
}
