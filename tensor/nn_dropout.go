package tensor

import (
	"runtime"
	"slices"
)

// Dropout as CUDA's native_dropout (fused_dropout_kernel) and
// native_dropout_backward (masked_scale): the mask is a bool tensor of the
// input's shape (1 byte per element), drawn from the Context's Philox
// generator; element i is kept when the generator's uniform float32 value
// at offset+i is below 1 − p.

// NativeDropout is native_dropout(x, p, train=True) for 0 < p < 1:
// allocates the mask (bool, x's shape), then the output (x's shape and
// dtype) = x·mask/(1 − p).
func NativeDropout(x *Tensor, p float64) (out, mask *Tensor, err error) {
	const fname = "tensor.native_dropout"
	if err := checkFloatOp(fname, "fused_dropout", x); err != nil {
		return nil, nil, err
	}
	dev := x.mem.Device()
	if mask, err = newTensor(x.ctx, fname, dev, Bool, slices.Clone(x.shape)); err != nil {
		return nil, nil, err
	}
	if out, err = newTensor(x.ctx, fname, dev, x.dtype, slices.Clone(x.shape)); err != nil {
		return nil, nil, err
	}
	n := x.Numel()
	seed, offset := x.ctx.draw(n)
	keep, scale := 1-p, 1/(1-p)
	err = actHostKernel(x.ctx, fname, []*Tensor{out, mask}, []*Tensor{x}, func(outs, ins []*Tensor) {
		xs := actReadF64(ins[0])
		// out and mask are new, contiguous: stored into directly
		o, m := outs[0], outs[1]
		so, sm := storeF64[o.dtype], storeF64[m.dtype]
		po, pm := elemAddr(o.mem.Pointer(), o.offset, o.dtype.Size()), elemAddr(m.mem.Pointer(), m.offset, m.dtype.Size())
		parallelForStop(x.ctx.stopFlag(), n, parallelThreshold/8, interruptGrain, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				y, k := 0.0, 0.0
				if randomValue(seed, offset+uint64(i), Float32, false) < keep {
					y, k = xs[i]*scale, 1
				}
				so(elemAddr(po, i, o.dtype.Size()), y)
				sm(elemAddr(pm, i, m.dtype.Size()), k)
			}
		})
		runtime.KeepAlive(o)
		runtime.KeepAlive(m)
	})
	if err != nil {
		return nil, nil, err
	}
	return out, mask, nil
}

// NativeDropoutBackward is native_dropout_backward(grad, mask, scale):
// grad·mask·scale, one allocation of grad's shape and dtype.
func NativeDropoutBackward(g, mask *Tensor, scale float64) (*Tensor, error) {
	const fname = "tensor.native_dropout_backward"
	if err := checkSameDevice(fname, g, mask); err != nil {
		return nil, err
	}
	if mask.dtype != Bool {
		return nil, errorf(fname, "Mask should be Bool Scalar Type %s", dtypes[mask.dtype].torch)
	}
	return mapNew(fname, g, g.dtype, []*Tensor{g, mask}, func(x []float64) float64 { return x[0] * x[1] * scale })
}
