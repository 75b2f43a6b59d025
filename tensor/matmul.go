package tensor

import (
	"slices"
	"strings"
)

// matmul is torch.matmul: 1-D·1-D is a dot product (0-dim result), 2-D×2-D
// a matrix product, a 1-D operand is treated as a row (left) or column
// (right) vector that is removed from the result, and higher ranks are
// batches of matrices whose batch dimensions broadcast. Both operands must
// have the same dtype and device; the result ([..., n, m], contiguous) is
// the only allocation.

// matmulOut is matmul into dst (the out= parameter) when dst is not nil:
// dst must be contiguous, of the result's shape, dtype and device, and
// not overlap a or b; then nothing is allocated.
func matmulOut(fname string, a, b, dst *Tensor) (*Tensor, error) {
	if err := a.checkLive(fname); err != nil {
		return nil, err
	}
	if err := b.checkLive(fname); err != nil {
		return nil, err
	}
	if len(a.shape) == 0 || len(b.shape) == 0 {
		return nil, errorf(fname, "both arguments to matmul need to be at least 1D, but they are %dD and %dD", len(a.shape), len(b.shape))
	}
	if a.mem.Device() != b.mem.Device() {
		return nil, errorf(fname, "expected all tensors to be on the same device, but found at least two devices, %s and %s", a.mem.Device(), b.mem.Device())
	}
	if a.dtype != b.dtype {
		return nil, errorf(fname, "expected both tensors to have the same dtype, but got: %s != %s", a.dtype, b.dtype)
	}
	if a.dtype == Bool {
		return nil, errorf(fname, "not implemented for 'bool'")
	}
	// Promote 1-D operands to matrices (views, no allocation).
	am, bm := a, b
	if len(a.shape) == 1 {
		am = unsqueezed(a, 0)
	}
	if len(b.shape) == 1 {
		bm = unsqueezed(b, 1)
	}
	ad, bd := len(am.shape), len(bm.shape)
	n, k := am.shape[ad-2], am.shape[ad-1]
	k2, m := bm.shape[bd-2], bm.shape[bd-1]
	if k != k2 {
		switch {
		case len(a.shape) == 1 && len(b.shape) == 1:
			return nil, errorf(fname, "inconsistent tensor size, expected tensor [%d] and src [%d] to have the same number of elements", a.shape[0], b.shape[0])
		case ad == 2 && bd == 2:
			return nil, errorf(fname, "mat1 and mat2 shapes cannot be multiplied (%dx%d and %dx%d)", n, k, k2, m)
		}
		return nil, errorf(fname, "size mismatch: %s @ %s (contracted dimensions %d and %d)", fmtShape(a.shape), fmtShape(b.shape), k, k2)
	}
	batch, err := broadcastShapes(fname, am.shape[:ad-2], bm.shape[:bd-2])
	if err != nil {
		return nil, err
	}
	// Result shape: batch + [n, m] without the vector dimensions.
	shape := slices.Clone(batch)
	if len(a.shape) > 1 {
		shape = append(shape, n)
	}
	if len(b.shape) > 1 {
		shape = append(shape, m)
	}
	var out *Tensor
	if dst != nil {
		if err := checkOut(fname, dst, a.mem.Device(), a.dtype, shape, a, b); err != nil {
			return nil, err
		}
		if dst.dtype != a.dtype || !dst.isContiguous() {
			return nil, errorf(fname, "for parameter out: want a contiguous %s tensor, got a %s one", a.dtype, layoutName(dst))
		}
		// The kernel writes from element 0 of a contiguous layout.
		out = dst.viewOf(shape, contiguousStrides(shape), dst.offset)
	} else {
		if out, err = newTensor(a.ctx, fname, a.mem.Device(), a.dtype, shape); err != nil {
			return nil, err
		}
	}
	if out.hasData() {
		aSt := batchStrides(am, batch)
		bSt := batchStrides(bm, batch)
		batchedMatmul(a.dtype, batch, am, bm, aSt, bSt, n, k, m, out)
	}
	if err := out.ctx.interrupted(fname); err != nil {
		return nil, err // a dst (out=) may be partly written
	}
	if dst != nil {
		return dst, nil
	}
	return out, nil
}

// layoutName describes t's dtype and layout for messages.
func layoutName(t *Tensor) string {
	if t.isContiguous() {
		return "contiguous " + t.dtype.String()
	}
	return "non-contiguous " + t.dtype.String()
}

// batchStrides returns the strides of t's batch dimensions (all but the
// last two) broadcast to batch.
func batchStrides(t *Tensor, batch []int) []int {
	nb := len(t.shape) - 2
	st := make([]int, len(batch))
	k := len(batch) - nb
	for d := range nb {
		if t.shape[d] != 1 {
			st[k+d] = t.strides[d]
		}
	}
	return st
}

// Matmul is torch.matmul: see matmul. The result is the only allocation.
func Matmul(a, b *Tensor) (*Tensor, error) { return MatmulOut(a, b, nil) }

// MatmulOut is torch.matmul(a, b, out=out): with out (contiguous, of the
// result's shape, dtype and device, not overlapping a or b) nothing is
// allocated and out's version is bumped; with nil it is Matmul.
func MatmulOut(a, b, out *Tensor) (*Tensor, error) {
	const fname = "tensor.matmul"
	var r *Tensor
	var err error
	if anyOnGPU(a, b, out) {
		ok := false
		if out == nil {
			r, ok, err = nativeMatmul(fname, a, b)
		}
		if !ok {
			r, err = stagedTensor(contextOf(a, b, out), fname, []*Tensor{a, b, out}, func(s *staging) (*Tensor, error) {
				return matmulOut(fname, s.shadowOf(a), s.shadowOf(b), s.shadowOf(out))
			})
		}
	} else {
		r, err = matmulOut(fname, a, b, out)
	}
	if err != nil {
		return nil, err
	}
	if out != nil {
		out.st.BumpVersion()
	}
	if strings.HasPrefix(r.Device(), "cuda") {
		// cuBLAS's workspace, after the output (blas_workspace.go).
		if err := r.ctx.blasWorkspace(r.Device(), false); err != nil {
			return nil, Renamed(err, fname)
		}
	}
	return r, nil
}
