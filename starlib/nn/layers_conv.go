package nn

import (
	"fmt"
	"math"
	"strings"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// Convolution, pooling and batch normalization layers (PyTorch's
// nn.Conv2d, nn.MaxPool2d, nn.BatchNorm2d) and their functional forms.
// Device memory follows PyTorch 2.x on CUDA: cudnn_convolution (no cuDNN
// workspace modelled: its size depends on the algorithm cuDNN picks),
// max_pool2d_with_indices, and cudnn_batch_norm (native_batch_norm
// without affine parameters); see tensor/nn_conv.go, nn_pool.go and
// nn_batchnorm.go.

func init() {
	registerPure("Conv2d", newConv2d)
	registerPure("MaxPool2d", newMaxPool2d)
	registerPure("BatchNorm2d", newBatchNorm2d)
	registerF("conv2d", fnConv2d)
	registerF("max_pool2d", fnMaxPool2d)
	registerF("batch_norm", fnBatchNorm)
}

// pairArg reads an int or a pair of ints (kernel_size, stride, ...).
func pairArg(fname, param string, v starlark.Value) ([2]int, error) {
	var p [2]int
	if v == nil {
		return p, fmt.Errorf("%s: %s: missing", fname, param)
	}
	if i, ok := v.(starlark.Int); ok {
		n, ok := i.Int64()
		if !ok {
			return p, fmt.Errorf("%s: %s: %s out of range", fname, param, i)
		}
		return [2]int{int(n), int(n)}, nil
	}
	seq, ok := v.(starlark.Indexable)
	if !ok || seq.Len() != 2 && seq.Len() != 1 {
		return p, fmt.Errorf("%s: %s: got %s, want an int or a tuple of two ints", fname, param, v.Type())
	}
	for i := range 2 {
		e := seq.Index(min(i, seq.Len()-1))
		n, err := starlark.AsInt32(e)
		if err != nil {
			return p, fmt.Errorf("%s: %s: element %d: got %s, want int", fname, param, i, e.Type())
		}
		p[i] = n
	}
	return p, nil
}

func pairString(p [2]int) string { return fmt.Sprintf("(%d, %d)", p[0], p[1]) }

// convPadding resolves padding: an int, a pair, "valid" or "same"
// (stride 1 and an even total padding per dimension only).
func convPadding(fname string, v starlark.Value, kernel, stride, dilation [2]int) ([2]int, error) {
	s, ok := starlark.AsString(v)
	if !ok {
		return pairArg(fname, "padding", v)
	}
	switch s {
	case "valid":
		return [2]int{}, nil
	case "same":
		if stride != [2]int{1, 1} {
			return [2]int{}, fmt.Errorf("%s: padding='same' is not supported for strided convolutions", fname)
		}
		var p [2]int
		for i := range 2 {
			total := dilation[i] * (kernel[i] - 1)
			if total%2 != 0 {
				return [2]int{}, fmt.Errorf("%s: padding='same' with an even effective kernel size needs asymmetric padding (an extra padded copy in PyTorch), which memsh does not model", fname)
			}
			p[i] = total / 2
		}
		return p, nil
	}
	return [2]int{}, fmt.Errorf("%s: Invalid padding string '%s'", fname, s)
}

// fnConv2d is nn.functional.conv2d(input, weight, bias=None, stride=1,
// padding=0, dilation=1, groups=1): input [N, C, H, W] (or unbatched [C,
// H, W]), weight [O, C/groups, KH, KW], bias [O]; the output [N, O, OH,
// OW] has input's dtype and device. On CUDA it is cudnn_convolution, the
// output its only allocation; saved as in PyTorch's derivatives.yaml for
// convolution (input and weight); the backward allocates grad_input,
// grad_weight, grad_bias as needed. cuDNN's workspace (algorithm-dependent)
// is not modelled: memsh allocates none.
func fnConv2d(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, w starlark.Value
	var bias starlark.Value = starlark.None
	var strideV, padV, dilV starlark.Value = starlark.MakeInt(1), starlark.MakeInt(0), starlark.MakeInt(1)
	groups := 1
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "weight", &w, "bias?", &bias, "stride?", &strideV, "padding?", &padV, "dilation?", &dilV, "groups?", &groups); err != nil {
		return nil, err
	}
	xt, err := tensorArg(b.Name(), "input", x)
	if err != nil {
		return nil, err
	}
	wt, err := tensorArg(b.Name(), "weight", w)
	if err != nil {
		return nil, err
	}
	bt, err := optTensorArg(b.Name(), "bias", bias)
	if err != nil {
		return nil, err
	}
	p, err := convParams(b.Name(), wt, strideV, padV, dilV, groups)
	if err != nil {
		return nil, err
	}
	return wrapNamed(b.Name())(autograd.Conv2d(xt, wt, bt, p))
}

func convParams(fname string, w *tensor.Tensor, strideV, padV, dilV starlark.Value, groups int) (tensor.ConvParams, error) {
	p := tensor.ConvParams{Groups: groups}
	var err error
	if p.Stride, err = pairArg(fname, "stride", strideV); err != nil {
		return p, err
	}
	if p.Dilation, err = pairArg(fname, "dilation", dilV); err != nil {
		return p, err
	}
	var k [2]int
	if s := w.Shape(); len(s) == 4 {
		k = [2]int{s[2], s[3]}
	}
	p.Padding, err = convPadding(fname, padV, k, p.Stride, p.Dilation)
	return p, err
}

// wrapNamed wraps a result, renaming the engine's op in an error.
func wrapNamed(fname string) func(*tensor.Tensor, error) (starlark.Value, error) {
	return func(t *tensor.Tensor, err error) (starlark.Value, error) {
		if err != nil {
			return nil, namedErr(fname, err)
		}
		return startensor.Wrap(t), nil
	}
}

func namedErr(fname string, err error) error {
	if r := tensor.Renamed(err, fname); r != err {
		return r
	}
	if strings.HasPrefix(err.Error(), fname) {
		return err
	}
	return fmt.Errorf("%s: %w", fname, err)
}

// newConv2d is nn.Conv2d(in_channels, out_channels, kernel_size, stride=1,
// padding=0, dilation=1, groups=1, bias=True, device=None, dtype=None):
// weight [out, in/groups, kh, kw] from kaiming_uniform_(a=√5) (fan_in =
// in/groups·kh·kw), bias [out] from U(±1/√fan_in), as reset_parameters.
// Forward is nn.functional.conv2d (cuDNN workspace not modelled).
func newConv2d(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var in, out int
	var kV starlark.Value
	var strideV, padV, dilV starlark.Value = starlark.MakeInt(1), starlark.MakeInt(0), starlark.MakeInt(1)
	groups := 1
	bias := true
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "in_channels", &in, "out_channels", &out, "kernel_size", &kV,
		"stride?", &strideV, "padding?", &padV, "dilation?", &dilV, "groups?", &groups, "bias?", &bias,
		"padding_mode?", new(string), "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	fname := b.Name()
	k, err := pairArg(fname, "kernel_size", kV)
	if err != nil {
		return nil, err
	}
	if groups <= 0 {
		return nil, fmt.Errorf("%s: groups must be a positive integer", fname)
	}
	if in%groups != 0 {
		return nil, fmt.Errorf("%s: in_channels must be divisible by groups", fname)
	}
	if out%groups != 0 {
		return nil, fmt.Errorf("%s: out_channels must be divisible by groups", fname)
	}
	if in < 0 || out < 0 || k[0] < 0 || k[1] < 0 {
		return nil, fmt.Errorf("%s: channels and kernel_size must be non-negative", fname)
	}
	stride, err := pairArg(fname, "stride", strideV)
	if err != nil {
		return nil, err
	}
	dil, err := pairArg(fname, "dilation", dilV)
	if err != nil {
		return nil, err
	}
	pad, err := convPadding(fname, padV, k, stride, dil)
	if err != nil {
		return nil, err
	}
	c, device, dt, err := factory(thread, fname, devV, dtV)
	if err != nil {
		return nil, err
	}
	w, err := tnn.Param(c, []int{out, in / groups, k[0], k[1]}, device, dt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	var bs *tensor.Tensor
	defer c.Hold(w)() // reachable while the bias is allocated
	if bias {
		if bs, err = tnn.Param(c, []int{out}, device, dt); err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
	}
	fanIn := in / groups * k[0] * k[1]
	if err := tnn.KaimingUniform_(w, math.Sqrt(5), fanIn); err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	if bs != nil {
		if err := tnn.BiasUniform_(bs, fanIn); err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
	}
	p := tensor.ConvParams{Stride: stride, Padding: pad, Dilation: dil, Groups: groups}
	m := newModule("Conv2d")
	m.param("weight", w)
	m.param("bias", bs)
	m.set("in_channels", starlark.MakeInt(in), kindAttr)
	m.set("out_channels", starlark.MakeInt(out), kindAttr)
	m.set("kernel_size", starlark.Tuple{starlark.MakeInt(k[0]), starlark.MakeInt(k[1])}, kindAttr)
	m.set("stride", starlark.Tuple{starlark.MakeInt(stride[0]), starlark.MakeInt(stride[1])}, kindAttr)
	m.set("padding", starlark.Tuple{starlark.MakeInt(pad[0]), starlark.MakeInt(pad[1])}, kindAttr)
	m.set("dilation", starlark.Tuple{starlark.MakeInt(dil[0]), starlark.MakeInt(dil[1])}, kindAttr)
	m.set("groups", starlark.MakeInt(groups), kindAttr)
	m.extra = func(m *Layer) string {
		s := fmt.Sprintf("%d, %d, kernel_size=%s, stride=%s", in, out, pairString(k), pairString(stride))
		if padS, ok := starlark.AsString(padV); ok {
			s += fmt.Sprintf(", padding=%s", padS)
		} else if pad != [2]int{} {
			s += ", padding=" + pairString(pad)
		}
		if dil != [2]int{1, 1} {
			s += ", dilation=" + pairString(dil)
		}
		if groups != 1 {
			s += fmt.Sprintf(", groups=%d", groups)
		}
		if m.tensorOf("bias") == nil {
			s += ", bias=False"
		}
		return s
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Conv2d", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("Conv2d", "input", x)
		if err != nil {
			return nil, err
		}
		return wrapNamed("Conv2d")(autograd.Conv2d(xt, m.tensorOf("weight"), m.tensorOf("bias"), p))
	}
	return m, nil
}

// poolParams reads max_pool2d's arguments (stride None or empty: the
// kernel size).
func poolParams(fname string, kV, strideV, padV, dilV starlark.Value, ceil bool) (tensor.PoolParams, error) {
	p := tensor.PoolParams{Ceil: ceil}
	var err error
	if p.Kernel, err = pairArg(fname, "kernel_size", kV); err != nil {
		return p, err
	}
	p.Stride = p.Kernel
	if strideV != starlark.None {
		if seq, ok := strideV.(starlark.Indexable); !ok || seq.Len() > 0 {
			if p.Stride, err = pairArg(fname, "stride", strideV); err != nil {
				return p, err
			}
		}
	}
	if p.Padding, err = pairArg(fname, "padding", padV); err != nil {
		return p, err
	}
	p.Dilation, err = pairArg(fname, "dilation", dilV)
	return p, err
}

func maxPoolResult(fname string, x *tensor.Tensor, p tensor.PoolParams, withIndices bool) (starlark.Value, error) {
	out, idx, err := autograd.MaxPool2d(x, p)
	if err != nil {
		return nil, namedErr(fname, err)
	}
	if withIndices {
		return starlark.Tuple{startensor.Wrap(out), startensor.Wrap(idx)}, nil
	}
	return startensor.Wrap(out), nil
}

// fnMaxPool2d is nn.functional.max_pool2d(input, kernel_size, stride=None,
// padding=0, dilation=1, ceil_mode=False, return_indices=False): input
// [N, C, H, W] or [C, H, W]; output [.., OH, OW] of input's dtype. As
// max_pool2d_with_indices on CUDA: output, then int64 indices of the
// output's shape (kept for backward — saved as in PyTorch's
// derivatives.yaml for max_pool2d_with_indices: self and the indices); the
// backward allocates one input-sized gradient.
func fnMaxPool2d(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, kV starlark.Value
	var strideV, padV, dilV starlark.Value = starlark.None, starlark.MakeInt(0), starlark.MakeInt(1)
	ceil, withIdx := false, false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "kernel_size", &kV, "stride?", &strideV, "padding?", &padV,
		"dilation?", &dilV, "ceil_mode?", &ceil, "return_indices?", &withIdx); err != nil {
		return nil, err
	}
	xt, err := tensorArg(b.Name(), "input", x)
	if err != nil {
		return nil, err
	}
	p, err := poolParams(b.Name(), kV, strideV, padV, dilV, ceil)
	if err != nil {
		return nil, err
	}
	return maxPoolResult(b.Name(), xt, p, withIdx)
}

// newMaxPool2d is nn.MaxPool2d(kernel_size, stride=None, padding=0,
// dilation=1, return_indices=False, ceil_mode=False): forward is
// nn.functional.max_pool2d.
func newMaxPool2d(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var kV starlark.Value
	var strideV, padV, dilV starlark.Value = starlark.None, starlark.MakeInt(0), starlark.MakeInt(1)
	ceil, withIdx := false, false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "kernel_size", &kV, "stride?", &strideV, "padding?", &padV,
		"dilation?", &dilV, "return_indices?", &withIdx, "ceil_mode?", &ceil); err != nil {
		return nil, err
	}
	p, err := poolParams(b.Name(), kV, strideV, padV, dilV, ceil)
	if err != nil {
		return nil, err
	}
	if strideV == starlark.None {
		strideV = kV
	}
	m := newModule("MaxPool2d")
	m.extra = func(*Layer) string {
		return fmt.Sprintf("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s", kV, strideV, padV, dilV, pyBool(ceil))
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("MaxPool2d", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("MaxPool2d", "input", x)
		if err != nil {
			return nil, err
		}
		return maxPoolResult("MaxPool2d", xt, p, withIdx)
	}
	return m, nil
}
