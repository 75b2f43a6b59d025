package tensor

import (
	"math"
	"runtime"
)

// 2-D max pooling as max_pool2d_with_indices on CUDA: the forward
// allocates the output and then the int64 indices (output-sized: flat
// positions h·W + w within each input plane); the backward
// (max_pool2d_with_indices_backward) allocates one input-sized gradient,
// zero-filled, and scatters the incoming gradient into it.

// PoolParams are max_pool2d's kernel_size, stride, padding, dilation
// (height, width) and ceil_mode.
type PoolParams struct {
	Kernel, Stride, Padding, Dilation [2]int
	Ceil                              bool
}

// poolOutSize is ATen's pooling_output_shape.
func poolOutSize(in, k, pad, stride, dil int, ceil bool) int {
	num := in + 2*pad - dil*(k-1) - 1
	if ceil {
		num += stride - 1
	}
	out := floorDiv(num, stride) + 1
	if ceil && (out-1)*stride >= in+pad {
		out--
	}
	return out
}

func floorDiv(a, b int) int {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// checkPool2d checks x ([C, H, W] or [N, C, H, W]) as ATen's
// pool2d_shape_check and returns the output shape.
func checkPool2d(fname string, x *Tensor, p PoolParams) ([]int, error) {
	if err := x.checkLive(fname); err != nil {
		return nil, err
	}
	if p.Kernel[0] <= 0 || p.Kernel[1] <= 0 {
		return nil, errorf(fname, "kernel size should be greater than zero, but got kH: %d kW: %d", p.Kernel[0], p.Kernel[1])
	}
	if p.Stride[0] <= 0 || p.Stride[1] <= 0 {
		return nil, errorf(fname, "stride should be greater than zero, but got dH: %d dW: %d", p.Stride[0], p.Stride[1])
	}
	if p.Dilation[0] <= 0 || p.Dilation[1] <= 0 {
		return nil, errorf(fname, "dilation should be greater than zero, but got dilationH: %d dilationW: %d", p.Dilation[0], p.Dilation[1])
	}
	nd := len(x.shape)
	okShape := nd == 3 || nd == 4
	if okShape {
		for _, s := range x.shape[nd-3:] {
			if s == 0 {
				okShape = false
			}
		}
	}
	if !okShape {
		return nil, errorf(fname, "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:%s", sizeList(x.shape))
	}
	for i := range 2 {
		if p.Padding[i] < 0 || p.Padding[i] > ((p.Kernel[i]-1)*p.Dilation[i]+1)/2 {
			return nil, errorf(fname, "pad should be at most half of effective kernel size, but got pad=%d, kernel_size=%d and dilation=%d", p.Padding[i], p.Kernel[i], p.Dilation[i])
		}
	}
	c, h, w := x.shape[nd-3], x.shape[nd-2], x.shape[nd-1]
	oh := poolOutSize(h, p.Kernel[0], p.Padding[0], p.Stride[0], p.Dilation[0], p.Ceil)
	ow := poolOutSize(w, p.Kernel[1], p.Padding[1], p.Stride[1], p.Dilation[1], p.Ceil)
	if oh < 1 || ow < 1 {
		return nil, errorf(fname, "Given input size: (%dx%dx%d). Calculated output size: (%dx%dx%d). Output size is too small", c, h, w, c, oh, ow)
	}
	if x.dtype == Bool || !x.dtype.IsFloat() && x.dtype != Int64 && x.dtype != Int32 {
		return nil, errorf(fname, "\"max_pool2d\" not implemented for '%s'", dtypeTitle(x.dtype))
	}
	out := append([]int{}, x.shape[:nd-2]...)
	return append(out, oh, ow), nil
}

// MaxPool2dWithIndices is max_pool2d_with_indices: the output and the
// int64 indices, both of the output's shape.
func MaxPool2dWithIndices(x *Tensor, p PoolParams) (out, idx *Tensor, err error) {
	const fname = "max_pool2d"
	if anyOnGPU(x) {
		err = staged(x.ctx, fname, []*Tensor{x}, func(s *staging) error {
			o, i, err := maxPool2d(fname, s.shadowOf(x), p)
			if err != nil {
				return err
			}
			if out, err = s.back(fname, o); err != nil {
				return err
			}
			idx, err = s.back(fname, i)
			return err
		})
		return out, idx, err
	}
	return maxPool2d(fname, x, p)
}

func maxPool2d(fname string, x *Tensor, p PoolParams) (out, idx *Tensor, err error) {
	shape, err := checkPool2d(fname, x, p)
	if err != nil {
		return nil, nil, err
	}
	dev := x.mem.Device()
	if out, err = newTensor(x.ctx, fname, dev, x.dtype, shape); err != nil {
		return nil, nil, err
	}
	// held while the indices are allocated, so that a reclaim then reaches
	// it instead of asking the collector whether this op still holds it
	defer x.ctx.Hold(out)()
	if idx, err = newTensor(x.ctx, fname, dev, Int64, shape); err != nil {
		return nil, nil, err
	}
	if !out.hasData() || out.Numel() == 0 {
		return out, idx, nil
	}
	nd := len(x.shape)
	h, w := x.shape[nd-2], x.shape[nd-1]
	oh, ow := shape[nd-2], shape[nd-1]
	xs := readFloats[float64](x)
	vals := make([]float64, out.Numel())
	ids := make([]float64, out.Numel())
	planes := x.Numel() / (h * w)
	parallelForStop(x.ctx.stopFlag(), planes, max(1, parallelThreshold/max(1, h*w)), stopGrain(oh*ow*p.Kernel[0]*p.Kernel[1]), func(lo, hi int) {
		for pl := lo; pl < hi; pl++ {
			src := xs[pl*h*w:][:h*w]
			for y := range oh {
				for xo := range ow {
					best, bi := math.Inf(-1), -1
					for i := range p.Kernel[0] {
						iy := y*p.Stride[0] - p.Padding[0] + i*p.Dilation[0]
						if iy < 0 || iy >= h {
							continue
						}
						for j := range p.Kernel[1] {
							ix := xo*p.Stride[1] - p.Padding[1] + j*p.Dilation[1]
							if ix < 0 || ix >= w {
								continue
							}
							v := src[iy*w+ix]
							if bi < 0 || v > best || math.IsNaN(v) && !math.IsNaN(best) {
								best, bi = v, iy*w+ix
							}
						}
					}
					k := (pl*oh+y)*ow + xo
					vals[k], ids[k] = best, float64(bi)
				}
			}
		}
	})
	if err := x.ctx.interrupted(fname); err != nil {
		return nil, nil, err // out and idx are dropped
	}
	writeFloats(out, vals)
	store := storeI64[Int64]
	i := 0
	forEachElem(idx, func(q elemPtr) bool {
		store(q, int64(ids[i]))
		i++
		return true
	})
	runtime.KeepAlive(x)
	return out, idx, nil
}

// MaxPool2dBackward is max_pool2d_with_indices_backward: an input-shaped
// gradient, zero-filled, with grad scattered (added) at the indices.
func MaxPool2dBackward(g, x, idx *Tensor) (*Tensor, error) {
	const fname = "max_pool2d_with_indices_backward"
	if anyOnGPU(g, x, idx) {
		return stagedTensor(contextOf(g, x, idx), fname, []*Tensor{g, x, idx}, func(s *staging) (*Tensor, error) {
			return maxPool2dBackward(fname, s.shadowOf(g), s.shadowOf(x), s.shadowOf(idx))
		})
	}
	return maxPool2dBackward(fname, g, x, idx)
}

func maxPool2dBackward(fname string, g, x, idx *Tensor) (*Tensor, error) {
	if !sameInts(g.shape, idx.shape) || len(g.shape) != len(x.shape) {
		return nil, errorf(fname, "grad_output of size %s does not match the indices' size %s", SizeString(g.shape), SizeString(idx.shape))
	}
	gi, err := newTensor(x.ctx, fname, x.mem.Device(), x.dtype, x.shape)
	if err != nil {
		return nil, err
	}
	if !gi.hasData() || gi.Numel() == 0 {
		return gi, nil
	}
	nd := len(x.shape)
	hw := x.shape[nd-2] * x.shape[nd-1]
	ohw := g.shape[nd-2] * g.shape[nd-1]
	gs := readFloats[float64](g)
	ids := make([]int64, idx.Numel())
	load := loadI64[Int64]
	i := 0
	forEachElem(idx, func(q elemPtr) bool {
		ids[i] = load(q)
		i++
		return true
	})
	dx := make([]float64, gi.Numel())
	for k, v := range gs {
		pl := k / ohw
		j := ids[k]
		if j < 0 || int(j) >= hw {
			return nil, errorf(fname, "index %d is out of range for an input plane of %d elements", j, hw)
		}
		dx[pl*hw+int(j)] += v
	}
	writeFloats(gi, dx)
	runtime.KeepAlive(g)
	runtime.KeepAlive(idx)
	return gi, nil
}
