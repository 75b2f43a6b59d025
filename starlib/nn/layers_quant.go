package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// bitsandbytes' 4-bit layer (QLoRA), bitsandbytes 0.45–0.49:
//
//	nn.Linear4bit(input_features, output_features, bias=True, compute_dtype=None,
//	              compress_statistics=True, quant_type="fp4", quant_storage="uint8",
//	              device=None, dtype=None)
//
// The weight is made as nn.Linear's (kaiming_uniform_, in dtype: float32
// unless given, the dtype a checkpoint's weights are loaded in) on the
// device, quantized there (bitsandbytes' Params4bit._quantize, what
// moving the layer to the GPU does: tensor.Quantize4bit, blocksize 64)
// and freed. The layer keeps the packed weight as its "weight" parameter
// (a Params4bit: uint8 [(n+1)/2, 1], requires_grad=False) and the
// quantization state as "quant_state" (bitsandbytes keeps it on the
// weight: weight.quant_state). The bias, if any, is a float parameter
// of dtype that requires grad.

// QuantState is the Starlark value of a 4-bit weight's quantization state
// (bitsandbytes' QuantState): absmax, shape, dtype, blocksize, code,
// quant_type, offset, state2, nested.
type QuantState struct {
	q *tensor.QuantState
}

var (
	_ starlark.HasAttrs = (*QuantState)(nil)
	_ env.Reacher       = (*QuantState)(nil)
)

func (s *QuantState) String() string {
	return fmt.Sprintf("QuantState(shape=%s, dtype=torch.%s, blocksize=%d, quant_type=%s, nested=%s)",
		shapeRepr(s.q.Shape), s.q.DType, s.q.Blocksize, s.q.QuantType, pyBool(s.q.Nested()))
}
func (s *QuantState) Type() string          { return "QuantState" }
func (s *QuantState) Freeze()               {}
func (s *QuantState) Truth() starlark.Bool  { return true }
func (s *QuantState) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: QuantState") }

// Reach reports the state's tensors (env.Reacher).
func (s *QuantState) Reach(w *env.Walker) { s.q.EachTensor(w.Tensor) }

func (s *QuantState) Attr(name string) (starlark.Value, error) {
	q := s.q
	opt := func(t *tensor.Tensor) starlark.Value {
		if t == nil {
			return starlark.None
		}
		return startensor.Wrap(t)
	}
	switch name {
	case "absmax":
		return opt(q.Absmax), nil
	case "shape":
		return intTuple(q.Shape), nil
	case "dtype":
		return startensor.DType(q.DType), nil
	case "blocksize":
		return starlark.MakeInt(q.Blocksize), nil
	case "code":
		return opt(q.Code), nil
	case "quant_type":
		if q.QuantType == "" {
			return starlark.None, nil
		}
		return starlark.String(q.QuantType), nil
	case "offset":
		return opt(q.Offset), nil
	case "state2":
		if q.State2 == nil {
			return starlark.None, nil
		}
		return &QuantState{q.State2}, nil
	case "nested":
		return starlark.Bool(q.Nested()), nil
	}
	return nil, nil
}

func (s *QuantState) AttrNames() []string {
	return []string{"absmax", "blocksize", "code", "dtype", "nested", "offset", "quant_type", "shape", "state2"}
}

func intTuple(xs []int) starlark.Tuple {
	t := make(starlark.Tuple, len(xs))
	for i, x := range xs {
		t[i] = starlark.MakeInt(x)
	}
	return t
}

func shapeRepr(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func init() { registerPure("Linear4bit", newLinear4bit) }

// optDType reads a dtype argument (a name, "torch." allowed, or None:
// Undefined).
func optDType(fname, param string, v starlark.Value) (tensor.DType, error) {
	if v == nil || v == starlark.None {
		return tensor.Undefined, nil
	}
	s, ok := starlark.AsString(v)
	if !ok {
		return tensor.Undefined, fmt.Errorf("%s: %s: got %s, want a dtype name or None", fname, param, v.Type())
	}
	d, ok := tensor.ParseDType(strings.TrimPrefix(s, "torch."))
	if !ok {
		return tensor.Undefined, fmt.Errorf("%s: %s: unknown dtype %q", fname, param, s)
	}
	return d, nil
}

// newLinear4bit is bitsandbytes.nn.Linear4bit (see above).
func newLinear4bit(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var in, out int
	bias, compress := true, true
	quantType, storage := "fp4", "uint8"
	var computeV, devV, dtV starlark.Value = starlark.None, starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input_features", &in, "output_features", &out, "bias?", &bias,
		"compute_dtype?", &computeV, "compress_statistics?", &compress, "quant_type?", &quantType, "quant_storage?", &storage,
		"device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	if err := positive(b.Name(), "input_features", in); err != nil {
		return nil, err
	}
	if err := positive(b.Name(), "output_features", out); err != nil {
		return nil, err
	}
	if quantType != "nf4" && quantType != "fp4" {
		return nil, fmt.Errorf("%s: quant_type: want \"nf4\" or \"fp4\", got %q", b.Name(), quantType)
	}
	if s := strings.TrimPrefix(storage, "torch."); s != "uint8" {
		return nil, fmt.Errorf("%s: quant_storage: only \"uint8\" (bitsandbytes' default) is modelled, got %q", b.Name(), storage)
	}
	compute, err := optDType(b.Name(), "compute_dtype", computeV)
	if err != nil {
		return nil, err
	}
	if compute != tensor.Undefined && !compute.IsFloat() {
		return nil, fmt.Errorf("%s: compute_dtype: want a floating dtype, got %s", b.Name(), compute)
	}
	c, device, dt, err := factory(thread, b.Name(), devV, dtV)
	if err != nil {
		return nil, err
	}
	if dt == tensor.Float64 {
		return nil, fmt.Errorf("%s: dtype: 4-bit quantization takes float32, float16 or bfloat16 weights, got float64", b.Name())
	}
	m, err := quantizedLinear(c, in, out, bias, device, dt, compute, compress, quantType)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return m, nil
}

// quantizedLinear makes a Linear4bit layer: nn.Linear's parameters in dt
// on device, the weight quantized and freed.
func quantizedLinear(c *tensor.Context, in, out int, bias bool, device string, dt, compute tensor.DType, compress bool, quantType string) (*Layer, error) {
	w, bs, err := tnn.NewLinearParams(c, in, out, bias, device, dt)
	if err != nil {
		return nil, err
	}
	defer c.Hold(bs)()
	return linear4bitFrom(w, bs, compute, compress, quantType)
}

// linear4bitFrom quantizes w (which it frees: Params4bit._quantize's
// local copy) into a Linear4bit layer with bias bs (kept as it is).
func linear4bitFrom(w, bs *tensor.Tensor, compute tensor.DType, compress bool, quantType string) (*Layer, error) {
	c := w.Context()
	release := c.Hold(w)
	packed, qs, err := tensor.Quantize4bit(w, 64, compress, quantType)
	release()
	if err != nil {
		return nil, err
	}
	tensor.Dropped(w)
	tnn.MarkParameter(packed)
	packed.Autograd().RequiresGrad = false
	in, out := qs.Shape[1], qs.Shape[0]
	m := newModule("Linear4bit")
	m.quant = qs
	m.param("weight", packed)
	m.param("bias", bs)
	m.set("in_features", starlark.MakeInt(in), kindAttr)
	m.set("out_features", starlark.MakeInt(out), kindAttr)
	m.set("quant_state", &QuantState{qs}, kindAttr)
	m.set("quant_type", starlark.String(quantType), kindAttr)
	m.set("compress_statistics", starlark.Bool(compress), kindAttr)
	computeSet := compute != tensor.Undefined
	m.set("compute_dtype", dtypeValue(compute), kindAttr)
	m.extra = func(m *Layer) string {
		return fmt.Sprintf("in_features=%d, out_features=%d, bias=%s", in, out, pyBool(m.tensorOf("bias") != nil))
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Linear4bit", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("Linear4bit", "input", x)
		if err != nil {
			return nil, err
		}
		bias := m.tensorOf("bias")
		if bias != nil && bias.DType() != xt.DType() {
			// "weights are cast automatically as Int8Params, but the
			// bias has to be cast manually": self.bias.data =
			// self.bias.data.to(x.dtype)
			if err := convertInPlace(bias, "", xt.DType()); err != nil {
				return nil, fmt.Errorf("Linear4bit: %w", err)
			}
		}
		if !computeSet {
			// set_compute_type: float32 and bfloat16 inputs compute in
			// their dtype; float16 keeps compute_dtype
			if dt := xt.DType(); dt == tensor.Float32 || dt == tensor.BFloat16 {
				compute = dt
				m.set("compute_dtype", dtypeValue(compute), kindAttr)
			}
			computeSet = true
		}
		return wrap(autograd.Linear4bit(xt, m.tensorOf("weight"), m.quant, bias, compute))
	}
	return m, nil
}

func dtypeValue(dt tensor.DType) starlark.Value {
	if dt == tensor.Undefined {
		return starlark.None
	}
	return startensor.DType(dt)
}
