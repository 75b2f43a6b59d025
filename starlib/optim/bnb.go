package optim

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/tensor/optim"
)

// BNB is optim.bnb, bitsandbytes' 8-bit optimizers (bnb.optim, 0.46+:
// block-wise states, 256-element blocks; tensor/optim/adam8bit.go lists
// their state and memory):
//
//	Adam8bit(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32,
//	         args=None, min_8bit_size=4096, is_paged=False)
//	AdamW8bit(... the same, weight_decay=0.01)
//	PagedAdam8bit(... as Adam8bit, without is_paged)    PagedAdamW8bit(... as AdamW8bit, without is_paged)
//
// States of parameters below min_8bit_size elements are float32, as in
// bitsandbytes. A paged optimizer's state1 and state2 of parameters of
// 100,000 elements or more are paged (managed) memory: not in
// cuda.memory_allocated(), counted by the optimizer's paged_bytes() and
// shown in its state as a struct (shape, dtype, nbytes, is_paged=True,
// device "cpu", page_deviceid). args is accepted only as None (its
// overrides are not modelled).
var BNB = &starlarkstruct.Module{Name: "optim.bnb", Members: starlark.StringDict{
	"Adam8bit":       starlark.NewBuiltin("optim.bnb.Adam8bit", newAdam8bit(false, false)),
	"AdamW8bit":      starlark.NewBuiltin("optim.bnb.AdamW8bit", newAdam8bit(true, false)),
	"PagedAdam8bit":  starlark.NewBuiltin("optim.bnb.PagedAdam8bit", newAdam8bit(false, true)),
	"PagedAdamW8bit": starlark.NewBuiltin("optim.bnb.PagedAdamW8bit", newAdam8bit(true, true)),
}}

func init() { Module.Members["bnb"] = BNB }

func newAdam8bit(decoupled, paged bool) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var paramsV starlark.Value
		lrN, epsN, wdN := number(0.001), number(1e-8), number(0.0)
		if decoupled {
			wdN = 0.01
		}
		betas := starlark.Tuple{starlark.Float(0.9), starlark.Float(0.999)}
		var amsgrad bool
		optimBits, minSize := 32, optim.Default8bitMinSize
		var argsV starlark.Value = starlark.None
		isPaged := paged
		spec := []any{"params", &paramsV, "lr?", &lrN, "betas?", &betas, "eps?", &epsN, "weight_decay?", &wdN,
			"amsgrad?", &amsgrad, "optim_bits?", &optimBits, "args?", &argsV, "min_8bit_size?", &minSize}
		if !paged {
			spec = append(spec, "is_paged?", &isPaged)
		}
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, spec...); err != nil {
			return nil, err
		}
		if argsV != starlark.None {
			return nil, fmt.Errorf("%s: for parameter args: only None is modelled, got %s", b.Name(), argsV.Type())
		}
		if len(betas) != 2 {
			return nil, fmt.Errorf("%s: for parameter betas: want a pair, got %d values", b.Name(), len(betas))
		}
		b1, ok1 := starlark.AsFloat(betas[0])
		b2, ok2 := starlark.AsFloat(betas[1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s: for parameter betas: want two numbers", b.Name())
		}
		if minSize < 0 {
			return nil, fmt.Errorf("%s: for parameter min_8bit_size: got %d, want 0 or more", b.Name(), minSize)
		}
		vals, ps, err := paramsArg(b.Name(), paramsV)
		if err != nil {
			return nil, err
		}
		o, err := optim.NewAdam8bit(ps, float64(lrN), b1, b2, float64(epsN), float64(wdN), amsgrad, optimBits, minSize, isPaged, decoupled)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		return &Optimizer{o: o, params: vals, group: starlark.StringDict{
			"lr": starlark.Float(lrN), "betas": betas, "eps": starlark.Float(epsN), "weight_decay": starlark.Float(wdN),
			"min_8bit_size": starlark.MakeInt(minSize), "is_paged": starlark.Bool(isPaged),
		}}, nil
	}
}

// pagedValue is a paged state buffer in the state dict.
func pagedValue(p *optim.PagedBuffer) starlark.Value {
	shape := make(starlark.Tuple, len(p.Shape))
	for i, s := range p.Shape {
		shape[i] = starlark.MakeInt(s)
	}
	return starlarkstruct.FromStringDict(starlark.String("paged"), starlark.StringDict{
		"shape": shape, "dtype": starlark.String(p.DType.String()), "nbytes": starlark.MakeUint64(p.Bytes()),
		"is_paged": starlark.True, "device": starlark.String("cpu"), "page_deviceid": starlark.MakeInt(p.DeviceID),
	})
}
