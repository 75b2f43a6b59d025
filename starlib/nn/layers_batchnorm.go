package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// fnBatchNorm is nn.functional.batch_norm(input, running_mean, running_var,
// weight=None, bias=None, training=False, momentum=0.1, eps=1e-05): input
// [N, C, ...], the others [C] or None; output of input's shape and dtype.
// As PyTorch 2.x on CUDA: with weight and bias (and input dim ≥ 3) it is
// cudnn_batch_norm — output, save_mean and save_var ([C] each in
// training, empty in evaluation) and a reserve space (0 bytes memsh;
// cuDNN's workspace is not modelled), saved as in PyTorch's
// derivatives.yaml for cudnn_batch_norm (input, weight, running stats,
// save_mean, save_var, reserve); the training backward allocates
// grad_input, grad_weight and grad_bias. Without them it is
// native_batch_norm (NativeBatchNormBackward0). In training the running
// statistics are updated in place (unbiased variance), as ATen does.
func fnBatchNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, rmV, rvV starlark.Value
	var wV, bV starlark.Value = starlark.None, starlark.None
	training := false
	momentum, eps := 0.1, 1e-5
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "running_mean", &rmV, "running_var", &rvV,
		"weight?", &wV, "bias?", &bV, "training?", &training, "momentum?", &momentum, "eps?", &eps); err != nil {
		return nil, err
	}
	ts := make([]*tensor.Tensor, 5)
	for i, v := range []starlark.Value{x, rmV, rvV, wV, bV} {
		name := []string{"input", "running_mean", "running_var", "weight", "bias"}[i]
		var err error
		if i == 0 {
			ts[i], err = tensorArg(b.Name(), name, v)
		} else {
			ts[i], err = optTensorArg(b.Name(), name, v)
		}
		if err != nil {
			return nil, err
		}
	}
	return wrapNamed(b.Name())(autograd.BatchNorm(ts[0], ts[3], ts[4], ts[1], ts[2], training, momentum, eps))
}

// newBatchNorm2d is nn.BatchNorm2d(num_features, eps=1e-05, momentum=0.1,
// affine=True, track_running_stats=True, device=None, dtype=None): weight
// ones and bias zeros [C] (affine); buffers running_mean zeros, running_var
// ones [C] and num_batches_tracked (an int64 0-dim tensor on the device)
// when tracking. In training mode forward increments num_batches_tracked
// in place and batch_norm updates the running statistics in place
// (momentum None: the cumulative average 1/num_batches_tracked). Input
// [N, C, H, W].
func newBatchNorm2d(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var num int
	eps := 1e-5
	var momV starlark.Value = starlark.Float(0.1)
	affine, track := true, true
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "num_features", &num, "eps?", &eps, "momentum?", &momV,
		"affine?", &affine, "track_running_stats?", &track, "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	fname := b.Name()
	if num < 0 {
		return nil, fmt.Errorf("%s: num_features must be non-negative, got %d", fname, num)
	}
	momentum, hasMomentum := 0.0, momV != starlark.None
	if hasMomentum {
		f, ok := starlark.AsFloat(momV)
		if !ok {
			return nil, fmt.Errorf("%s: momentum: got %s, want float or None", fname, momV.Type())
		}
		momentum = f
	}
	c, device, dt, err := factory(thread, fname, devV, dtV)
	if err != nil {
		return nil, err
	}
	// each tensor made is reachable while the next is allocated
	defer c.Hold()()
	m := newModule("BatchNorm2d")
	if affine {
		w, err := tnn.Filled(c, []int{num}, 1, device, dt, true)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
		c.Hold(w)
		bs, err := tnn.Filled(c, []int{num}, 0, device, dt, true)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
		c.Hold(bs)
		m.param("weight", w)
		m.param("bias", bs)
	} else {
		m.param("weight", nil)
		m.param("bias", nil)
	}
	if track {
		rm, err := tnn.Filled(c, []int{num}, 0, device, dt, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
		c.Hold(rm)
		rv, err := tnn.Filled(c, []int{num}, 1, device, dt, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
		c.Hold(rv)
		nbt, err := tensor.Zeros(c, []int{}, tensor.Int64, device)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
		c.Hold(nbt)
		m.buffer("running_mean", rm)
		m.buffer("running_var", rv)
		m.buffer("num_batches_tracked", nbt)
	} else {
		m.buffer("running_mean", nil)
		m.buffer("running_var", nil)
		m.buffer("num_batches_tracked", nil)
	}
	m.set("num_features", starlark.MakeInt(num), kindAttr)
	m.set("eps", starlark.Float(eps), kindAttr)
	m.set("momentum", momV, kindAttr)
	m.set("affine", starlark.Bool(affine), kindAttr)
	m.set("track_running_stats", starlark.Bool(track), kindAttr)
	m.extra = func(*Layer) string {
		return fmt.Sprintf("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s", num, starlark.Float(eps), momV, pyBool(affine), pyBool(track))
	}
	batches := 0 // num_batches_tracked's value, for momentum=None
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("BatchNorm2d", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("BatchNorm2d", "input", x)
		if err != nil {
			return nil, err
		}
		if xt.Dim() != 4 {
			return nil, fmt.Errorf("BatchNorm2d: expected 4D input (got %dD input)", xt.Dim())
		}
		factor := momentum
		if m.training && track {
			if nbt := m.tensorOf("num_batches_tracked"); nbt != nil {
				if _, err := tensor.BinaryInPlace(tensor.OpAdd, nbt, tensor.Int(1)); err != nil {
					return nil, fmt.Errorf("BatchNorm2d: %w", err)
				}
				batches++
				if !hasMomentum {
					factor = 1 / float64(batches)
				}
			}
		}
		rm, rv := m.tensorOf("running_mean"), m.tensorOf("running_var")
		bnTraining := m.training || rm == nil && rv == nil
		if m.training && !track {
			rm, rv = nil, nil
		}
		return wrapNamed("BatchNorm2d")(autograd.BatchNorm(xt, m.tensorOf("weight"), m.tensorOf("bias"), rm, rv, bnTraining, factor, eps))
	}
	return m, nil
}
