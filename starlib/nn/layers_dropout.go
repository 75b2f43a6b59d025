package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor/autograd"
)

// Dropout with CUDA's semantics (native_dropout):
//
//	nn.Dropout(p=0.5, inplace=False)   uses the module's training flag (train()/eval())
//	nn.functional.dropout(input, p=0.5, training=True, inplace=False)
//
// In training with 0 < p < 1: a bool mask (1 byte per element, saved as
// in PyTorch's derivatives.yaml for native_dropout: result1) and the
// output (input's shape and dtype); backward allocates one input-sized
// gradient. p == 0 or not training: the input itself, nothing allocated.
// p == 1: zeros (input * a 0-dim zero tensor). p outside [0, 1] is an
// error. inplace=True is not supported.
func init() {
	registerPure("Dropout", newDropout)
	registerF("dropout", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var pV starlark.Value = starlark.Float(0.5)
		training, inplace := true, false
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "p?", &pV, "training?", &training, "inplace?", &inplace); err != nil {
			return nil, err
		}
		p, err := dropoutP(b.Name(), pV)
		if err != nil {
			return nil, err
		}
		return dropout(b.Name(), x, p, training, inplace)
	})
}

// dropoutP reads p (a number in [0, 1]; the error shows it as given, as
// Python's f-string does).
func dropoutP(fname string, v starlark.Value) (float64, error) {
	p, ok := starlark.AsFloat(v)
	if !ok {
		return 0, fmt.Errorf("%s: for parameter p: got %s, want float", fname, v.Type())
	}
	if p < 0 || p > 1 {
		return 0, fmt.Errorf("%s: dropout probability has to be between 0 and 1, but got %s", fname, v)
	}
	return p, nil
}

func dropout(fname string, x starlark.Value, p float64, training, inplace bool) (starlark.Value, error) {
	if inplace {
		return nil, fmt.Errorf("%s: inplace=True is not supported", fname)
	}
	xt, err := tensorArg(fname, "input", x)
	if err != nil {
		return nil, err
	}
	out, err := autograd.Dropout(xt, p, training)
	if err != nil {
		return nil, renameErr(err, fname)
	}
	if out == xt {
		return x, nil // the input itself, as PyTorch returns it
	}
	return wrap(out, nil)
}

// newDropout is nn.Dropout(p=0.5, inplace=False).
func newDropout(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var pV starlark.Value = starlark.Float(0.5)
	inplace := false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "p?", &pV, "inplace?", &inplace); err != nil {
		return nil, err
	}
	if _, err := dropoutP(b.Name(), pV); err != nil {
		return nil, err
	}
	return dropoutLayer(pV, inplace), nil
}

// dropoutLayer is an nn.Dropout module of probability pV (checked).
func dropoutLayer(pV starlark.Value, inplace bool) *Layer {
	m := newModule("Dropout")
	m.set("p", pV, kindAttr)
	m.set("inplace", starlark.Bool(inplace), kindAttr)
	m.extra = func(m *Layer) string { return fmt.Sprintf("p=%s, inplace=%s", m.entry("p"), pyBool(inplace)) }
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Dropout", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		p, err := dropoutP("Dropout", m.entry("p")) // drop.p may have been reassigned
		if err != nil {
			return nil, err
		}
		return dropout("Dropout", x, p, m.training, inplace)
	}
	return m
}

// pyFloatRepr formats f as Python's repr of a float ("0.5", "2.0", "1e-05").
func pyFloatRepr(f float64) string { return starlark.Float(f).String() }
