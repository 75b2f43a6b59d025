// Package optim holds memsh's optimizers with the update rules and the
// device memory of their sources on CUDA: PyTorch 2.x's SGD, Adam and
// AdamW (foreach, per-parameter and fused paths) and Adafactor,
// transformers' Adafactor, bitsandbytes' 8-bit and paged Adam/AdamW, the
// GradScaler and gradient clipping (clip_grad_norm_). State is created at
// the first Step (momentum buffers, moments, factored moments, 8-bit
// codes and block scales), step counters are host scalars (device
// tensors on the fused path), and each path makes the temporaries of the
// source's code, kept alive as long as its Python variables keep them
// (locals.go).
//
// Optimizers run with autograd's grad mode off and know nothing of
// Starlark; starlib/optim binds them.
package optim

import (
	"errors"
	"fmt"
	"math"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Optimizer is what every optimizer offers.
type Optimizer interface {
	// Name is PyTorch's class name ("Adam").
	Name() string
	// Params returns the optimized tensors, in order.
	Params() []*tensor.Tensor
	// Step performs one update with the parameters' current .grad
	// (parameters without a gradient are skipped).
	Step() error
	// State returns the per-parameter state: name → value (tensors on the
	// parameter's device, or float64 host scalars such as "step").
	State(p *tensor.Tensor) map[string]any
	// StateTensors calls fn with each tensor among State(p)'s values,
	// without building State's map (memtrack calls it at every peak).
	StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor))
}

// each calls fn with the non-nil tensors of ts.
func each(fn func(*tensor.Tensor), ts ...*tensor.Tensor) {
	for _, t := range ts {
		if t != nil {
			fn(t)
		}
	}
}

// ZeroGrad clears the gradients of params (Optimizer.zero_grad): with
// setToNone (PyTorch's default) .grad becomes None and its memory is
// released; otherwise it is zeroed in place.
func ZeroGrad(params []*tensor.Tensor, setToNone bool) error {
	for _, p := range params {
		g := autograd.Grad(p)
		if g == nil {
			continue
		}
		if setToNone {
			if err := autograd.SetGrad(p, nil); err != nil {
				return err
			}
			continue
		}
		if _, err := g.Fill_(tensor.Float(0)); err != nil {
			return err
		}
	}
	return nil
}

func checkParams(name string, params []*tensor.Tensor) error {
	if len(params) == 0 {
		return fmt.Errorf("%s: optimizer got an empty parameter list", name)
	}
	seen := map[*tensor.Tensor]bool{}
	for _, p := range params {
		if seen[p] {
			return fmt.Errorf("%s: some parameters appear more than once; in future this will cause an error", name)
		}
		seen[p] = true
		if !autograd.IsLeaf(p) {
			return fmt.Errorf("%s: can't optimize a non-leaf Tensor", name)
		}
	}
	return nil
}

func checkNonNeg(name, what string, v float64) error {
	if v < 0 || math.IsNaN(v) {
		return fmt.Errorf("%s: Invalid %s: %v", name, what, v)
	}
	return nil
}

// group splits params by (device, dtype) in first-seen order, as
// Optimizer._group_tensors_by_device_and_dtype.
func group(params []*tensor.Tensor) [][]int {
	type key struct {
		dev string
		dt  tensor.DType
	}
	idx := map[key]int{}
	var out [][]int
	for i, p := range params {
		k := key{p.Device(), p.DType()}
		j, ok := idx[k]
		if !ok {
			j = len(out)
			idx[k] = j
			out = append(out, nil)
		}
		out[j] = append(out[j], i)
	}
	return out
}

// withGrads returns the indices of the parameters that have a gradient.
func withGrads(params []*tensor.Tensor) []int {
	var out []int
	for i, p := range params {
		if autograd.Grad(p) != nil {
			out = append(out, i)
		}
	}
	return out
}

var errSparse = errors.New("sparse gradients are not supported")

// noGrad runs f, a step, with grad mode off in the params' context, in
// a Quiet region of their Manager (backend.Manager.Quiet): the steps run
// no Starlark and say when they let go of temporaries (dropped,
// tensor.Dropped, the frame of locals.go), so exact peak mode reclaims
// before a peak only once something may have become garbage (a foreach
// step's list of square roots, each a new peak, was a reclaim walking
// the whole list per root).
func noGrad(params []*tensor.Tensor, f func() error) error {
	ctx := params[0].Context()
	if ctx != nil && ctx.Manager != nil {
		defer ctx.Manager.Quiet()()
	}
	return autograd.NoGrad(ctx, f)
}

// dropped tells p's Manager that the step let go of temporaries (as
// PyTorch's Python step rebinds or deletes them): exact peak mode looks
// for garbage before the next allocation. Only the step's Go code (its
// variables, Context.Hold, its locals frame: roots of every walk) held
// them, so what the frames of the reclaim's walks reach is what it was
// (backend.Manager.NoteHeldGarbage); a state tensor let go is noted by
// its optimizer (marked.changed).
func dropped(p *tensor.Tensor) {
	if ctx := p.Context(); ctx != nil && ctx.Manager != nil {
		ctx.Manager.NoteHeldGarbage()
	}
}
