package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Losses:
//
//	nn.functional.cross_entropy(input, target, ignore_index=-100, reduction="mean")
//	    input [N, C] (or [C]) float logits, target [N] (or 0-dim) int64 class indices;
//	    a 0-dim loss ([N] for "none"). log_softmax(input, 1) (saved, input-sized) then
//	    nll_loss, which keeps a 0-dim total_weight: saved as in PyTorch's derivatives.yaml
//	    for _log_softmax (result) and nll_loss_forward (self, target, total_weight).
//	nn.functional.mse_loss(input, target, reduction="mean")
//	    operands broadcast to one shape; a 0-dim loss that keeps an input-sized storage
//	    (PyTorch's structured kernel, 1.13 and 2.x); saved as in derivatives.yaml for
//	    mse_loss (self, target).
//	nn.CrossEntropyLoss(ignore_index=-100, reduction="mean")  nn.MSELoss(reduction="mean")
func init() {
	registerF("cross_entropy", crossEntropyBuiltin)
	registerF("mse_loss", mseLossBuiltin)
	registerPure("CrossEntropyLoss", newCrossEntropyLoss)
	registerPure("MSELoss", newMSELoss)
}

func reductionArg(fname string, s string) (tensor.Reduction, error) {
	r, err := tensor.ParseReduction(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", fname, err)
	}
	return r, nil
}

func crossEntropy(fname string, x, y starlark.Value, ignore int, reduction string) (starlark.Value, error) {
	red, err := reductionArg(fname, reduction)
	if err != nil {
		return nil, err
	}
	xt, err := tensorArg(fname, "input", x)
	if err != nil {
		return nil, err
	}
	yt, err := tensorArg(fname, "target", y)
	if err != nil {
		return nil, err
	}
	if !xt.DType().IsFloat() {
		return nil, fmt.Errorf("%s: \"log_softmax\" not implemented for '%s'", fname, xt.DType())
	}
	if sameShape(xt.Shape(), yt.Shape()) && xt.Dim() > 1 {
		return nil, fmt.Errorf("%s: targets of class probabilities (target of the input's shape) are not supported; pass class indices (int64)", fname)
	}
	out, err := autograd.CrossEntropy(xt, yt, red, int64(ignore))
	if err != nil {
		return nil, tensor.Renamed(err, fname)
	}
	return wrap(out, nil)
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func crossEntropyBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, y starlark.Value
	ignore := -100
	reduction := "mean"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "target", &y, "ignore_index?", &ignore, "reduction?", &reduction); err != nil {
		return nil, err
	}
	return crossEntropy(b.Name(), x, y, ignore, reduction)
}

// broadcastShape is torch.broadcast_shapes of two shapes.
func broadcastShape(fname string, a, b []int) ([]int, error) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := range n {
		da, db := 1, 1
		if k := i - (n - len(a)); k >= 0 {
			da = a[k]
		}
		if k := i - (n - len(b)); k >= 0 {
			db = b[k]
		}
		switch {
		case da == db || db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("%s: The size of tensor a (%d) must match the size of tensor b (%d) at non-singleton dimension %d", fname, da, db, i)
		}
	}
	return out, nil
}

func mseLoss(fname string, x, y starlark.Value, reduction string) (starlark.Value, error) {
	red, err := reductionArg(fname, reduction)
	if err != nil {
		return nil, err
	}
	xt, err := tensorArg(fname, "input", x)
	if err != nil {
		return nil, err
	}
	yt, err := tensorArg(fname, "target", y)
	if err != nil {
		return nil, err
	}
	// F.mse_loss: torch.broadcast_tensors(input, target) (views; an
	// operand already of the common shape is passed as is).
	shape, err := broadcastShape(fname, xt.Shape(), yt.Shape())
	if err != nil {
		return nil, err
	}
	if !sameShape(xt.Shape(), shape) {
		if xt, err = autograd.Expand(xt, shape); err != nil {
			return nil, tensor.Renamed(err, fname)
		}
	}
	if !sameShape(yt.Shape(), shape) {
		if yt, err = autograd.Expand(yt, shape); err != nil {
			return nil, tensor.Renamed(err, fname)
		}
	}
	out, err := autograd.MseLoss(xt, yt, red)
	if err != nil {
		return nil, tensor.Renamed(err, fname)
	}
	return wrap(out, nil)
}

func mseLossBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, y starlark.Value
	reduction := "mean"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "target", &y, "reduction?", &reduction); err != nil {
		return nil, err
	}
	return mseLoss(b.Name(), x, y, reduction)
}

// newCrossEntropyLoss is nn.CrossEntropyLoss(ignore_index=-100,
// reduction="mean"): calling it is cross_entropy(input, target).
func newCrossEntropyLoss(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	ignore := -100
	reduction := "mean"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "ignore_index?", &ignore, "reduction?", &reduction); err != nil {
		return nil, err
	}
	if _, err := reductionArg(b.Name(), reduction); err != nil {
		return nil, err
	}
	m := newModule("CrossEntropyLoss")
	m.set("ignore_index", starlark.MakeInt(ignore), kindAttr)
	m.set("reduction", starlark.String(reduction), kindAttr)
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, y starlark.Value
		if err := starlark.UnpackPositionalArgs("CrossEntropyLoss", args, kwargs, 2, &x, &y); err != nil {
			return nil, err
		}
		return crossEntropy("CrossEntropyLoss", x, y, ignore, reduction)
	}
	return m, nil
}

// newMSELoss is nn.MSELoss(reduction="mean"): calling it is
// mse_loss(input, target).
func newMSELoss(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	reduction := "mean"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "reduction?", &reduction); err != nil {
		return nil, err
	}
	if _, err := reductionArg(b.Name(), reduction); err != nil {
		return nil, err
	}
	m := newModule("MSELoss")
	m.set("reduction", starlark.String(reduction), kindAttr)
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, y starlark.Value
		if err := starlark.UnpackPositionalArgs("MSELoss", args, kwargs, 2, &x, &y); err != nil {
			return nil, err
		}
		return mseLoss("MSELoss", x, y, reduction)
	}
	return m, nil
}
