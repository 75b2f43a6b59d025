package tensor

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// A Tensor is the Starlark value of type "tensor": the binding of one
// engine *tensor.Tensor (a strided view of elements of one dtype stored in
// a *backend.Memory owned by the Session's Manager). One engine tensor
// always yields the same value (the value is cached in its Binding field).
// Views (indexing, slicing, view, transpose, ...) share their base's
// Memory; the memory is freed by the Manager's next reclaim once no
// tensor refers to it.
//
// Value semantics, where Starlark differs from Python:
//   - a tensor is unhashable; == and != compare identity (they must give
//     a bool in Starlark) and < <= > >= are errors: the elementwise
//     comparisons are the methods eq ne lt le gt ge;
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
	t *tensor.Tensor
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
)

// Wrap returns the Starlark value of an engine tensor (the same value for
// the same engine tensor every time).
func Wrap(t *tensor.Tensor) *Tensor {
	if w, ok := t.Binding.(*Tensor); ok {
		return w
	}
	w := &Tensor{t: t}
	t.Binding = w
	return w
}

// Engine returns the engine tensor.
func (t *Tensor) Engine() *tensor.Tensor { return t.t }

// HeldMemory implements env.Holder: the Memory the tensor (and every view
// of it) keeps alive.
func (t *Tensor) HeldMemory() *backend.Memory { return t.t.Memory() }

// IsView reports whether t was created as a view of another tensor.
func (t *Tensor) IsView() bool { return t.t.IsView() }

// String returns the PyTorch-style representation.
func (t *Tensor) String() string { return t.t.String() }

// Type returns "tensor".
func (t *Tensor) Type() string { return "tensor" }

// Freeze does nothing: tensor data is device memory, outside Starlark's
// freeze model (like an open file).
func (t *Tensor) Freeze() {}

// Truth reports whether the tensor has at least one element.
func (t *Tensor) Truth() starlark.Bool { return t.t.Numel() > 0 }

// Hash fails: tensors are unhashable.
func (t *Tensor) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: tensor") }

// Len is the size of dimension 0 (0 for a 0-dim tensor).
func (t *Tensor) Len() int {
	if t.t.Dim() == 0 {
		return 0
	}
	return t.t.Shape()[0]
}

// Index returns t[i] (0 <= i < Len()), a view.
func (t *Tensor) Index(i int) starlark.Value { return Wrap(autograd.Select0(t.t, i)) }

// Slice returns t[start:end:step] along dimension 0, a view.
func (t *Tensor) Slice(start, end, step int) starlark.Value {
	return Wrap(autograd.Slice0(t.t, start, end, step))
}

// Get implements t[i] and t[i, j, ...] with int indices (negative ones
// count from the end), and with None and index tensors among them
// (PyTorch's advanced indexing: t[None, idx], t[i0, i1, None]; see
// indexTensors).
func (t *Tensor) Get(k starlark.Value) (starlark.Value, bool, error) {
	v, err := t.index("tensor index", k)
	if err != nil {
		return nil, true, err
	}
	return Wrap(v), true, nil
}

func (t *Tensor) index(fname string, k starlark.Value) (*tensor.Tensor, error) {
	var idx []starlark.Value
	switch k := k.(type) {
	case starlark.Tuple:
		idx = k
	default:
		idx = []starlark.Value{k}
	}
	for _, x := range idx {
		if _, ok := x.(starlark.Int); !ok {
			return t.indexTensors(fname, idx)
		}
	}
	shape := t.t.Shape()
	if len(idx) > len(shape) {
		if len(shape) == 0 {
			return nil, fmt.Errorf("%s: invalid index of a 0-dim tensor", fname)
		}
		return nil, fmt.Errorf("%s: too many indices for tensor of dimension %d", fname, len(shape))
	}
	r := t.t
	for d, x := range idx {
		xi, ok := x.(starlark.Int)
		if !ok {
			return nil, fmt.Errorf("%s: got %s, want int or tuple of ints", fname, x.Type())
		}
		i, ok := xi.Int64()
		size := shape[d]
		if ok && i < 0 {
			i += int64(size)
		}
		if !ok || i < 0 || i >= int64(size) {
			return nil, fmt.Errorf("%s: index %s is out of bounds for dimension %d with size %d", fname, xi, d, size)
		}
		r = autograd.Select0(r, int(i))
	}
	if r == t.t {
		return autograd.Index(t.t)
	}
	return r, nil
}

// SetKey implements t[i] = v and t[i, j] = v: v is a number (fill) or a
// tensor broadcastable to t[i] (copy). Nothing is allocated.
func (t *Tensor) SetKey(k, v starlark.Value) error {
	const fname = "tensor.__setitem__"
	if keys, ok := k.(starlark.Tuple); ok || k == starlark.None {
		for _, x := range keys {
			if _, isInt := x.(starlark.Int); !isInt {
				return fmt.Errorf("%s: only int indices are supported in an assignment (t[i, j] = v), got %s", fname, x.Type())
			}
		}
		if k == starlark.None {
			return fmt.Errorf("%s: only int indices are supported in an assignment (t[i, j] = v), got NoneType", fname)
		}
	} else if _, isInt := k.(starlark.Int); !isInt {
		return fmt.Errorf("%s: only int indices are supported in an assignment (t[i, j] = v), got %s", fname, k.Type())
	}
	dst, err := t.index(fname, k)
	if err != nil {
		return err
	}
	return fillOrCopy(fname, dst, v, true)
}

// fillOrCopy is dst.fill_(v) for a number or a 0-dim tensor v, and
// dst.copy_(v) for any tensor when copyAny.
func fillOrCopy(fname string, dst *tensor.Tensor, v starlark.Value, copyAny bool) error {
	if src, ok := v.(*Tensor); ok && (copyAny || src.t.Dim() == 0) {
		_, err := dst.Copy_(src.t)
		return rename(err, fname)
	}
	s, err := scalarArg(v)
	if err != nil {
		return fmt.Errorf("%s: for parameter value: got %s, want number", fname, v.Type())
	}
	_, err = dst.Fill_(s)
	return rename(err, fname)
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
	*p = Wrap(autograd.Select0(it.t.t, it.i))
	it.i++
	return true
}

func (it *tensorIter) Done() {}

// Has implements "x in t": whether some element equals the number x.
func (t *Tensor) Has(y starlark.Value) (bool, error) {
	const fname = "tensor.__contains__"
	var s tensor.Scalar
	if b, isBool := y.(starlark.Bool); isBool {
		s = tensor.BoolScalar(bool(b))
	} else if f, ok := starlark.AsFloat(y); ok {
		s = tensor.Float(f)
	} else {
		return false, fmt.Errorf("%s: got %s, want a number", fname, y.Type())
	}
	return tensor.Contains(t.t, s)
}

// Binary implements + - * / // % between tensors and numbers.
func (t *Tensor) Binary(op syntax.Token, y starlark.Value, side starlark.Side) (starlark.Value, error) {
	bop, ok := binaryOpOf(op)
	if !ok {
		return nil, nil
	}
	other, err := operandArg(y)
	if err == errNotOperand {
		return nil, nil // let Starlark report "unknown binary op"
	} else if err != nil {
		return nil, fmt.Errorf("%s: %v", bop, err)
	}
	if side == starlark.Right {
		return result(autograd.Binary(bop, other, t.t))
	}
	return result(autograd.Binary(bop, t.t, other))
}

// Unary implements -t and +t.
func (t *Tensor) Unary(op syntax.Token) (starlark.Value, error) {
	switch op {
	case syntax.MINUS:
		return result(autograd.Neg(t.t))
	case syntax.PLUS:
		return t, nil
	}
	return nil, nil
}

// CompareSameType implements == and != as identity (PyTorch's elementwise
// == cannot return a tensor in Starlark); ordering comparisons fail with a
// pointer to the elementwise methods.
func (t *Tensor) CompareSameType(op syntax.Token, y starlark.Value, depth int) (bool, error) {
	switch op {
	case syntax.EQL:
		return t == y, nil
	case syntax.NEQ:
		return t != y, nil
	}
	return false, fmt.Errorf("tensor %s tensor: not supported: use t.lt(other), t.le, t.gt, t.ge, t.eq, t.ne for elementwise comparisons, or t.equal(other)", op)
}

// Attr returns an attribute or a bound method.
func (t *Tensor) Attr(name string) (starlark.Value, error) {
	e := t.t
	switch name {
	case "shape":
		return shapeTuple(e.Shape()), nil
	case "dtype":
		return DType(e.DType()), nil
	case "device":
		return starlark.String(e.Device()), nil
	case "nbytes":
		return starlark.MakeInt(e.NBytes()), nil
	case "ndim":
		return starlark.MakeInt(e.Dim()), nil
	case "is_view":
		return starlark.Bool(e.IsView()), nil
	case "storage_id":
		return starlark.MakeUint64(e.Memory().Seq()), nil
	case "storage_offset":
		return starlark.MakeInt(e.Offset()), nil
	case "is_cuda":
		return starlark.Bool(e.Device() != "cpu"), nil
	case "T":
		return Wrap(autograd.ReverseDims(e)), nil
	}
	if v, ok := autogradAttr(t, name); ok {
		return v, nil
	}
	if m, ok := methods[name]; ok {
		b := starlark.NewBuiltin("tensor."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return m(thread, b.Name(), b.Receiver().(*Tensor), args, kwargs)
		})
		if pureOps[name] {
			b.DeclarePure()
		} else if inPlaceOps[name] {
			b = starlark.NewBuiltin("tensor."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
				r := b.Receiver().(*Tensor)
				defer noteInPlace(r)()
				return m(thread, b.Name(), r, args, kwargs)
			}).DeclarePure()
		}
		return b.BindReceiver(t), nil
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

// binaryOpOf maps a Starlark operator to the engine's binary op.
func binaryOpOf(op syntax.Token) (tensor.BinaryOp, bool) {
	switch op {
	case syntax.PLUS:
		return tensor.OpAdd, true
	case syntax.MINUS:
		return tensor.OpSub, true
	case syntax.STAR:
		return tensor.OpMul, true
	case syntax.SLASH:
		return tensor.OpDiv, true
	case syntax.SLASHSLASH:
		return tensor.OpFloorDivide, true
	case syntax.PERCENT:
		return tensor.OpRemainder, true
	}
	return 0, false
}
