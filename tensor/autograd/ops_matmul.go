package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// Matrix products, saved as PyTorch's derivatives.yaml saves them: mm and
// addmm keep mat2 only when mat1 needs a gradient and mat1 only when mat2
// does; matmul is ATen's composite (folding, or expand + reshape + bmm, so
// a non-contiguous batched operand is saved as the contiguous copy bmm
// receives).

// Mm is the matrix product of two 2-D tensors (MmBackward0).
func Mm(a, b *tensor.Tensor) (*tensor.Tensor, error) { return mmLike("MmBackward0", nil, a, b) }

// Addmm is bias + a @ b (AddmmBackward0): bias's gradient is the incoming
// gradient, summed to bias's shape by the engine.
func Addmm(bias, a, b *tensor.Tensor) (*tensor.Tensor, error) {
	return mmLike("AddmmBackward0", bias, a, b)
}

func mmLike(name string, bias, a, b *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(lowerPrecision, &bias, &a, &b)
	if err != nil {
		return nil, err
	}
	defer release()
	var n *Node
	if bias != nil {
		n = newNode(name, bias, a, b)
	} else {
		n = newNode(name, a, b)
	}
	off := 0
	if bias != nil {
		off = 1
	}
	aShape, aStrides := a.Shape(), a.Strides()
	bShape, bStrides := b.Shape(), b.Strides()
	sa, sb := saveProductOperands(n, off, a, b)
	var out *tensor.Tensor
	if bias != nil {
		out, err = addmm(bias, a, b)
	} else {
		out, err = mm(a, b)
	}
	if err != nil || n == nil {
		return out, err
	}
	// The order of the two products: AddmmBackward0 computes mat1's
	// gradient first, MmBackward0 mat2's (torch 2.11's allocator trace of
	// a GPT-2 step on an H100, with the autograd node and ATen op of each
	// allocation: testdata/torchref/cuda/h100_trace_b1_ckpt_cpp.jsonl.gz).
	mat2First := bias == nil
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, off+2)
		if off == 1 && n.needsGrad(0) {
			res[0] = g[0]
		}
		mat1 := func() error {
			if !n.needsGrad(off + 0) {
				return nil
			}
			bv, err := sb.Unpack()
			if err != nil {
				return err
			}
			res[off], err = mmMat1Backward(g[0], bv, aShape, aStrides)
			return err
		}
		mat2 := func() error {
			if !n.needsGrad(off + 1) {
				return nil
			}
			av, err := sa.Unpack()
			if err != nil {
				return err
			}
			res[off+1], err = mmMat2Backward(g[0], av, bShape, bStrides)
			return err
		}
		first, second := mat1, mat2
		if mat2First {
			first, second = mat2, mat1
		}
		if err := first(); err != nil {
			return nil, err
		}
		// the first gradient is held while the second is computed
		defer ctxOf(n).Hold(res...)()
		if err := second(); err != nil {
			return nil, err
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// columnMajor reports a matrix stored transposed (strides (1, rows)).
func columnMajor(shape, strides []int) bool {
	return strides[0] == 1 && strides[1] == shape[0] && shape[0] > 1 && shape[1] > 1
}

// mmMat1Backward: grad @ mat2ᵀ, computed so the result has mat1's layout
// (PyTorch's mm_mat1_backward).
func mmMat1Backward(g, mat2 *tensor.Tensor, shape, strides []int) (*tensor.Tensor, error) {
	m2t, err := transpose(mat2, 0, 1)
	if err != nil {
		return nil, err
	}
	return mmInLayout(g, m2t, columnMajor(shape, strides))
}

// mmMat2Backward: mat1ᵀ @ grad, computed so the result has mat2's layout
// (PyTorch's mm_mat2_backward).
func mmMat2Backward(g, mat1 *tensor.Tensor, shape, strides []int) (*tensor.Tensor, error) {
	m1t, err := transpose(mat1, 0, 1)
	if err != nil {
		return nil, err
	}
	return mmInLayout(m1t, g, columnMajor(shape, strides))
}

// mmInLayout is x @ y, one allocation; for a column-major target it is
// computed as (yᵀ @ xᵀ)ᵀ, so the result is stored transposed like the
// input it is the gradient of (and AccumulateGrad can steal it).
func mmInLayout(x, y *tensor.Tensor, colMajor bool) (*tensor.Tensor, error) {
	if !colMajor {
		return mm(x, y)
	}
	xt, err := transpose(x, 0, 1)
	if err != nil {
		return nil, err
	}
	yt, err := transpose(y, 0, 1)
	if err != nil {
		return nil, err
	}
	r, err := mm(yt, xt)
	if err != nil {
		return nil, err
	}
	return transpose(r, 0, 1)
}

// Bmm is the batched product of two 3-D tensors (BmmBackward0: saves both
// as needed; gradients grad @ mat2ᵀ and selfᵀ @ grad).
func Bmm(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(lowerPrecision, &a, &b)
	if err != nil {
		return nil, err
	}
	defer release()
	n := newNode("BmmBackward0", a, b)
	sa, sb := saveProductOperands(n, 0, a, b)
	out, err := bmm(a, b)
	if err != nil || n == nil {
		return out, err
	}
	// mat2's gradient first, as MmBackward0 (torch 2.11's trace on an H100:
	// attention's att @ v allocates v's gradient, then att's).
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 2)
		if n.needsGrad(1) {
			av, err := sa.Unpack()
			if err != nil {
				return nil, err
			}
			at, err := transpose(av, 1, 2)
			if err != nil {
				return nil, err
			}
			if res[1], err = bmm(at, g[0]); err != nil {
				return nil, err
			}
			defer ctxOf(n).Hold(res[1])() // while mat1's is computed
		}
		if n.needsGrad(0) {
			bv, err := sb.Unpack()
			if err != nil {
				return nil, err
			}
			bt, err := transpose(bv, 1, 2)
			if err != nil {
				return nil, err
			}
			if res[0], err = bmm(g[0], bt); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// Matmul is torch.matmul with ATen's composite decomposition (so the graph
// and the saved tensors are PyTorch's): 2-D @ 2-D is mm; an N-D (N ≥ 3)
// left operand times a 1-D or 2-D right operand is folded into one mm over
// a reshape; otherwise both operands are expanded to the broadcast batch
// shape, reshaped to 3-D (a copy when the batch dimensions cannot be
// merged) and multiplied with bmm.
func Matmul(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(lowerPrecision, &a, &b)
	if err != nil {
		return nil, err
	}
	defer release()
	if !recording(a, b) {
		return tensor.Matmul(a, b)
	}
	da, db := a.Dim(), b.Dim()
	if da == 0 || db == 0 {
		return nil, fmt.Errorf("both arguments to matmul need to be at least 1D, but they are %dD and %dD", da, db)
	}
	switch {
	case da == 2 && db == 2:
		return Mm(a, b)
	case da == 1 && db == 1, da == 2 && db == 1, da == 1 && db == 2:
		a2, b2 := a, b
		var err error
		if da == 1 {
			if a2, err = Unsqueeze(a, 0); err != nil {
				return nil, err
			}
		}
		if db == 1 {
			if b2, err = Unsqueeze(b, 1); err != nil {
				return nil, err
			}
		}
		r, err := Mm(a2, b2)
		if err != nil {
			return nil, err
		}
		if db == 1 {
			if r, err = Squeeze(r, []int{-1}); err != nil {
				return nil, err
			}
		}
		if da == 1 {
			if r, err = Squeeze(r, []int{0}); err != nil {
				return nil, err
			}
		}
		return r, nil
	case da >= 3 && (db == 1 || db == 2):
		as := a.Shape()
		k := as[da-1]
		rows := 1
		for _, s := range as[:da-1] {
			rows *= s
		}
		a2, err := Reshape(a, []int{rows, k})
		if err != nil {
			return nil, err
		}
		b2 := b
		if db == 1 {
			if b2, err = Unsqueeze(b, 1); err != nil {
				return nil, err
			}
		}
		r, err := Mm(a2, b2)
		if err != nil {
			return nil, err
		}
		outShape := append([]int{}, as[:da-1]...)
		if db == 2 {
			outShape = append(outShape, b.Shape()[1])
		}
		return unsafeView(r, outShape)
	}
	// Batched.
	as, bs := a.Shape(), b.Shape()
	if da == 1 {
		as = []int{1, as[0]}
	}
	if db == 1 {
		bs = []int{bs[0], 1}
	}
	n1, m1 := as[len(as)-2], as[len(as)-1]
	m2, p := bs[len(bs)-2], bs[len(bs)-1]
	if m1 != m2 {
		return nil, fmt.Errorf("Expected size for first two dimensions of batch2 tensor to be: [%d, %d] but got: [%d, %d].", batchProd(as[:len(as)-2], bs[:len(bs)-2]), m1, batchProd(as[:len(as)-2], bs[:len(bs)-2]), m2)
	}
	batch, err := broadcastShape(as[:len(as)-2], bs[:len(bs)-2])
	if err != nil {
		return nil, err
	}
	nb := 1
	for _, s := range batch {
		nb *= s
	}
	a1, b1 := a, b
	if da == 1 {
		if a1, err = Unsqueeze(a, 0); err != nil {
			return nil, err
		}
	}
	if db == 1 {
		if b1, err = Unsqueeze(b, 1); err != nil {
			return nil, err
		}
	}
	ae, err := expandIfNeeded(a1, append(append([]int{}, batch...), n1, m1))
	if err != nil {
		return nil, err
	}
	be, err := expandIfNeeded(b1, append(append([]int{}, batch...), m2, p))
	if err != nil {
		return nil, err
	}
	a3, err := Reshape(ae, []int{nb, n1, m1})
	if err != nil {
		return nil, err
	}
	releaseA3 := a.Context().Hold(a3) // while b3 and the product are made
	b3, err := Reshape(be, []int{nb, m2, p})
	if err != nil {
		releaseA3()
		return nil, err
	}
	release3 := a.Context().Hold(b3)
	r, err := Bmm(a3, b3)
	release3()
	releaseA3()
	if err != nil {
		return nil, err
	}
	out := append([]int{}, batch...)
	if da > 1 {
		out = append(out, n1)
	}
	if db > 1 {
		out = append(out, p)
	}
	return unsafeView(r, out)
}

// expandIfNeeded is ATen's expand, which records ExpandBackward0 even when
// the shape does not change.
func expandIfNeeded(t *tensor.Tensor, shape []int) (*tensor.Tensor, error) { return Expand(t, shape) }

// unsafeView is at::_unsafe_view (UnsafeViewBackward0).
func unsafeView(t *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	in := t.Shape()
	return viewOp("UnsafeViewBackward0", t, func() (*tensor.Tensor, error) { return view(t, shape) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) })
}

func batchProd(a, b []int) int {
	s, _ := broadcastShape(a, b)
	p := 1
	for _, d := range s {
		p *= d
	}
	return p
}

func broadcastShape(a, b []int) ([]int, error) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := range n {
		x, y := 1, 1
		if j := len(a) - n + i; j >= 0 {
			x = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			y = b[j]
		}
		switch {
		case x == y, y == 1:
			out[i] = x
		case x == 1:
			out[i] = y
		default:
			return nil, fmt.Errorf("The size of tensor a (%d) must match the size of tensor b (%d) at non-singleton dimension %d", x, y, i)
		}
	}
	return out, nil
}

// Linear is torch.nn.functional.linear(input, weight, bias) with ATen's
// decomposition: a 2-D input with a bias is addmm(bias, input, weight.t());
// a contiguous N-D input with a bias is flattened to 2-D (a view), run
// through addmm and viewed back; otherwise matmul(input, weight.t()) plus
// an in-place bias add.
func Linear(x, w, bias *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(lowerPrecision, &x, &w, &bias)
	if err != nil {
		return nil, err
	}
	defer release()
	ws := w.Shape()
	xs := x.Shape()
	if len(ws) != 2 {
		return nil, fmt.Errorf("linear: weight must be 2-D, got %d-D", len(ws))
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("linear: input must have at least 1 dimension")
	}
	if xs[len(xs)-1] != ws[1] {
		rows := 1
		for _, s := range xs[:len(xs)-1] {
			rows *= s
		}
		return nil, fmt.Errorf("mat1 and mat2 shapes cannot be multiplied (%dx%d and %dx%d)", rows, xs[len(xs)-1], ws[1], ws[0])
	}
	wt, err := T(w)
	if err != nil {
		return nil, err
	}
	if bias != nil && len(xs) == 2 {
		return Addmm(bias, x, wt)
	}
	if bias != nil && len(xs) >= 3 && x.IsContiguous() {
		rows := 1
		for _, s := range xs[:len(xs)-1] {
			rows *= s
		}
		x2, err := Reshape(x, []int{rows, xs[len(xs)-1]})
		if err != nil {
			return nil, err
		}
		r, err := Addmm(bias, x2, wt)
		if err != nil {
			return nil, err
		}
		return View(r, append(append([]int{}, xs[:len(xs)-1]...), ws[0]))
	}
	out, err := Matmul(x, wt)
	if err != nil {
		return nil, err
	}
	if bias != nil {
		if _, err := BinaryInPlace(tensor.OpAdd, out, bias); err != nil {
			return nil, err
		}
	}
	return out, nil
}
