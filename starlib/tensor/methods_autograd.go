package tensor

import (
	"fmt"
	"sort"
	"sync"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Autograd in the binding (package tensor/autograd does the work):
//
// Attributes: requires_grad (settable on leaves), grad (settable; None
// releases it), grad_fn (PyTorch's node name, e.g. "AddmmBackward0", or
// None for a leaf), is_leaf.
//
// Methods:
//
//	backward(gradient=None, retain_graph=False)   accumulates .grad of the graph's leaves
//	detach()                                        a tensor sharing storage, outside the graph
//	requires_grad_(requires_grad=True)              on a leaf; returns the tensor
//	retain_grad()                                   keep .grad of a non-leaf after backward
//	pow(exponent) rsqrt()                           differentiable
//
// Module functions: no_grad(fn, *args, **kwargs) runs fn with grad mode
// off and returns its result; is_grad_enabled(); every creation function
// takes requires_grad=False.
func init() {
	for name, fn := range map[string]methodFn{
		"backward":       methodBackward,
		"detach":         noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return Wrap(autograd.Detach(t.t)), nil }),
		"requires_grad_": methodRequiresGrad,
		"retain_grad": noArgs(func(f string, t *Tensor) (starlark.Value, error) {
			if err := autograd.RetainGrad(t.t); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			return starlark.None, nil
		}),
		"register_post_accumulate_grad_hook": registerPostAccumulateGradHook,
		"pow":                                methodPow,
		"rsqrt":                              noArgs(func(f string, t *Tensor) (starlark.Value, error) { return resultAs(f)(autograd.Rsqrt(t.t)) }),
	} {
		methods[name] = fn
		attrNames = append(attrNames, name)
	}
	attrNames = append(attrNames, "grad", "grad_fn", "is_leaf", "requires_grad")
	sort.Strings(attrNames)
	for _, name := range []string{"pow", "rsqrt"} {
		Module.Members[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
	}
	Module.Members["no_grad"] = starlark.NewBuiltin("tensor.no_grad", noGrad)
	Module.Members["meta_device"] = starlark.NewBuiltin("tensor.meta_device", metaDevice)
	Module.Members["is_grad_enabled"] = starlark.NewBuiltin("tensor.is_grad_enabled", isGradEnabled)
	for _, name := range []string{"zeros", "ones", "empty", "full", "rand", "randn", "arange", "tensor",
		"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like"} {
		Module.Members[name] = withRequiresGrad(Module.Members[name].(*starlark.Builtin))
	}
}

// declarePure declares the module's pure functions (pureOps) pure, once
// every file's init has added its members and its pure names (the inits
// run in file order, so one of them cannot do it for the others).
var declarePure = sync.OnceFunc(func() {
	for name, v := range Module.Members {
		if b, ok := v.(*starlark.Builtin); ok && pureOps[name] {
			b.DeclarePure()
		}
	}
})

// pureOps are the module functions and Tensor methods that change no
// value that existed before the call — they make new tensors, views or
// plain values (starlark.Builtin.DeclarePure) — so that a reclaim inside
// a deep recursion need not walk the frames below again (scope/reach.go).
// In-place ops, backward() and anything that sets state are not here.
var pureOps = map[string]bool{
	"zeros": true, "ones": true, "empty": true, "full": true, "rand": true, "randn": true,
	"arange": true, "tensor": true, "zeros_like": true, "ones_like": true, "empty_like": true,
	"full_like": true, "rand_like": true, "randn_like": true, "cat": true, "stack": true,
	"matmul": true, "mm": true, "addmm": true, "argmax": true, "relu": true, "neg": true, "abs": true, "exp": true, "log": true,
	"sqrt": true, "tanh": true, "sigmoid": true, "add": true, "sub": true, "mul": true,
	"div": true, "eq": true, "ne": true, "lt": true, "le": true, "gt": true, "ge": true,
	"equal": true, "allclose": true, "sum": true, "mean": true, "max": true, "min": true,
	"clone": true, "reshape": true, "transpose": true, "t": true, "permute": true,
	"flatten": true, "squeeze": true, "unsqueeze": true, "numel": true, "narrow": true,
	"select": true, "pow": true, "rsqrt": true,
	"element_size": true, "dim": true, "is_contiguous": true, "data_ptr": true, "size": true,
	"to": true, "cpu": true, "cuda": true, "float": true, "double": true, "half": true,
	"bfloat16": true, "long": true, "int": true, "bool": true, "contiguous": true, "view": true,
	"expand": true, "item": true, "tolist": true, "detach": true, "softmax": true,
	"log_softmax": true, "split": true, "chunk": true, "masked_fill": true, "triu": true,
	"tril": true, "where": true, "index_select": true, "randint": true, "is_tensor": true,
	"get_default_device": true, "initial_seed": true, "is_grad_enabled": true,
	// calls under a mode (no_grad, meta_device): what fn changes, its own
	// code says (as nn.autocast and nn.checkpoint)
	"no_grad": true, "meta_device": true,
}

// inPlaceOps are the Tensor methods that rewrite their receiver in place.
// What changes is the receiver alone: its values, and its grad_fn
// (autograd's rebase) and requires_grad, which may make it reach other
// memory. So they are declared pure, which keeps starlark.Mutations
// still (moving it would make the next reclaim walk every frame again: a
// loop of index_add_ over a Mixture of Experts' experts walked the whole
// forward's graph at each allocation), and note the change of the
// receiver alone (noteInPlace), as setting a gradient does.
var inPlaceOps = map[string]bool{
	"add_": true, "sub_": true, "mul_": true, "div_": true, "copy_": true, "fill_": true, "zero_": true,
	"index_add_": true, "masked_fill_": true, "relu_": true, "requires_grad_": true,
}

// noteInPlace tells the Manager that t may reach other memory, before an
// in-place op rewrites it and again after (its Go code allocates, so a
// reclaim may run between): the reach walks' kept frames that met t are
// walked again (tensor.Tensor.ReachChanged).
func noteInPlace(t *Tensor) (after func()) {
	t.t.ReachChanged()
	return t.t.ReachChanged
}

// autogradAttr returns the autograd attributes.
func autogradAttr(t *Tensor, name string) (starlark.Value, bool) {
	switch name {
	case "requires_grad":
		return starlark.Bool(autograd.RequiresGrad(t.t)), true
	case "is_leaf":
		return starlark.Bool(autograd.IsLeaf(t.t)), true
	case "grad_fn":
		if n := autograd.GradFn(t.t); n != nil {
			return starlark.String(n.Name()), true
		}
		return starlark.None, true
	case "grad":
		if g := autograd.Grad(t.t); g != nil {
			return Wrap(g), true
		}
		return starlark.None, true
	}
	return nil, false
}

// SetField sets requires_grad or grad.
func (t *Tensor) SetField(name string, v starlark.Value) error {
	switch name {
	case "requires_grad":
		b, ok := v.(starlark.Bool)
		if !ok {
			return fmt.Errorf("tensor.requires_grad: got %s, want bool", v.Type())
		}
		return autograd.SetRequiresGrad(t.t, bool(b))
	case "grad":
		if v == starlark.None {
			return autograd.SetGrad(t.t, nil)
		}
		g, ok := v.(*Tensor)
		if !ok {
			return fmt.Errorf("assigned grad expected to be a Tensor or None but got grad of type %s", v.Type())
		}
		return autograd.SetGrad(t.t, g.t)
	}
	return starlark.NoSuchAttrError(fmt.Sprintf("tensor has no settable attribute %q", name))
}

// References implements refpath.Referrer: a tensor leads to its .grad, so
// reports and leak paths name gradients ("model.fc.weight.grad").
func (t *Tensor) References(edge func(suffix string, v starlark.Value)) {
	if g := autograd.Grad(t.t); g != nil {
		edge(".grad", Wrap(g))
	}
}

func methodBackward(thread *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var gradV, retainV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(fname, args, kwargs, "gradient?", &gradV, "retain_graph?", &retainV, "create_graph?", new(bool)); err != nil {
		return nil, err
	}
	var grads []*tensor.Tensor
	if gradV != starlark.None {
		g, ok := gradV.(*Tensor)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter gradient: got %s, want tensor or None", fname, gradV.Type())
		}
		grads = []*tensor.Tensor{g.t}
	}
	retain := false
	if retainV != starlark.None {
		b, ok := retainV.(starlark.Bool)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter retain_graph: got %s, want bool or None", fname, retainV.Type())
		}
		retain = bool(b)
	}
	// The engine reports what it holds, node by node (tensor.Context.Root).
	thread.DeclareReported()
	if err := autograd.Backward([]*tensor.Tensor{t.t}, grads, retain); err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return starlark.None, nil
}

func methodRequiresGrad(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	on := true
	if err := starlark.UnpackArgs(fname, args, kwargs, "requires_grad?", &on); err != nil {
		return nil, err
	}
	if err := autograd.SetRequiresGrad(t.t, on); err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return t, nil
}

func methodPow(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var ev starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "exponent", &ev); err != nil {
		return nil, err
	}
	e, ok := starlark.AsFloat(ev)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter exponent: got %s, want a number", fname, ev.Type())
	}
	return resultAs(fname)(autograd.PowScalar(t.t, e))
}

// noGrad is tensor.no_grad(fn, *args, **kwargs): fn(*args, **kwargs) with
// grad mode off (torch.no_grad), restored afterwards, also on error.
func noGrad(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return callUnder(thread, b, args, kwargs, autograd.NoGrad)
}

// metaDevice is tensor.meta_device(fn, *args, **kwargs): fn's new
// tensors on PyTorch's meta device (`with torch.device("meta"):`),
// memory deferred until Module.to_empty (tensor.MetaDevice).
func metaDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return callUnder(thread, b, args, kwargs, tensor.MetaDevice)
}

// callUnder calls fn(*args[1:], **kwargs) — args[0] — inside mode, a
// mode of the tensor Context (the with-block of no_grad, meta_device).
func callUnder(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple, mode func(*tensor.Context, func() error) error) (starlark.Value, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument fn", b.Name())
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want callable", b.Name(), args[0].Type())
	}
	c, err := contextOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	var out starlark.Value
	thread.DeclareTransparent()
	err = mode(c, func() error {
		var err error
		out, err = starlark.Call(thread, fn, args[1:], kwargs)
		return err
	})
	return out, err
}

func isGradEnabled(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	c, err := contextOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	return starlark.Bool(autograd.GradEnabled(c)), nil
}

// withRequiresGrad adds requires_grad=False to a creation function: the
// result becomes a leaf that requires grad (floating dtypes only, as
// PyTorch).
func withRequiresGrad(b *starlark.Builtin) *starlark.Builtin {
	return starlark.NewBuiltin(b.Name(), func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		rg := false
		rest := kwargs[:0:0]
		for _, kv := range kwargs {
			if string(kv[0].(starlark.String)) == "requires_grad" {
				v, ok := kv[1].(starlark.Bool)
				if !ok {
					return nil, fmt.Errorf("%s: for parameter requires_grad: got %s, want bool", b.Name(), kv[1].Type())
				}
				rg = bool(v)
				continue
			}
			rest = append(rest, kv)
		}
		if rg {
			// Check the dtype before allocating: nothing half-done.
			for _, kv := range rest {
				if string(kv[0].(starlark.String)) == "dtype" {
					if dt, err := dtypeArg(b.Name(), kv[1], tensor.DefaultFloat); err == nil && !dt.IsFloat() {
						return nil, fmt.Errorf("%s: only Tensors of floating point dtype can require gradients", b.Name())
					}
				}
			}
		}
		v, err := b.CallInternal(thread, args, rest)
		if err != nil || !rg {
			return v, err
		}
		t := v.(*Tensor)
		if err := autograd.SetRequiresGrad(t.t, true); err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		return t, nil
	})
}

// InPlaceBinary implements env.InPlaceOperand: a += b, a -= b, a *= b and
// a /= b on a tensor are in place (add_ sub_ mul_ div_), as in PyTorch.
// A result dtype the tensor cannot hold (an int tensor /= 2) declines, so
// Starlark's out-of-place meaning applies, as Python's a = a / 2 would.
func (t *Tensor) InPlaceBinary(op syntax.Token, y starlark.Value) (starlark.Value, error) {
	defer noteInPlace(t)() // the augmented assignment's built-in is pure (scope)
	bop, ok := binaryOpOf(op)
	if !ok || bop == tensor.OpFloorDivide || bop == tensor.OpRemainder {
		return nil, nil
	}
	if bop == tensor.OpDiv && !t.t.DType().IsFloat() {
		return nil, nil
	}
	other, err := operandArg(y)
	if err != nil {
		return nil, nil
	}
	if _, err := autograd.BinaryInPlace(bop, t.t, other); err != nil {
		return nil, err
	}
	return t, nil
}

var _ env.InPlaceOperand = (*Tensor)(nil)

func init() {
	Module.Members["randint"] = starlark.NewBuiltin("tensor.randint", randint)
}

// randint is tensor.randint(low=0, high, size, dtype=int64, device=None):
// integers uniform in [low, high) (torch.randint), from the session's
// generator. randint(high, size) is randint(0, high, size).
func randint(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	c, err := contextOf(thread, fname)
	if err != nil {
		return nil, err
	}
	var a1, a2, a3 starlark.Value
	var dtV, devV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "low", &a1, "high?", &a2, "size?", &a3, "dtype?", &dtV, "device?", &devV); err != nil {
		return nil, err
	}
	lowV, highV, sizeV := starlark.Value(starlark.MakeInt(0)), a1, a2
	if a3 != nil {
		lowV, highV, sizeV = a1, a2, a3
	}
	if sizeV == nil {
		return nil, fmt.Errorf("%s: missing argument for size", fname)
	}
	var low, high int64
	if err := starlark.AsInt(lowV, &low); err != nil {
		return nil, fmt.Errorf("%s: for parameter low: %v", fname, err)
	}
	if err := starlark.AsInt(highV, &high); err != nil {
		return nil, fmt.Errorf("%s: for parameter high: %v", fname, err)
	}
	shape, err := shapeArg(fname, "size", sizeV)
	if err != nil {
		return nil, err
	}
	dt, err := dtypeArg(fname, dtV, tensor.Int64)
	if err != nil {
		return nil, err
	}
	device, err := deviceArg(c, fname, devV)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(tensor.Randint(c, low, high, shape, dt, device))
}

// Install prepares the tensor state of a new Session's Env: the engine
// Context, and env.Env.Seed so that log.start(seed=N) reseeds the
// session's generator before each input (CellLogger's cl_set_seed).
func Install(e *env.Env) {
	declarePure()
	c := Context(e)
	e.Seed = func(seed int64) { c.ManualSeed(uint64(seed)) }
}
