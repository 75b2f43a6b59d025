package tensor

import (
	"slices"
	"testing"
)

// TestIterStrides checks the layouts of new results against PyTorch's
// (1.13, CPU; TensorIterator and _to_copy are the same code on CUDA):
//
//	v = torch.arange(6).view(2, 3).t()           (-v).stride() == (1, 3)
//	x = torch.empty(2, 3, 4, 5)[..., :4].transpose(1, 2)
//	x.to(torch.float64).stride() == x.clone().stride() == (x * 2).stride() == (48, 4, 16, 1)
//	a = torch.empty(4, 1, 3).transpose(0, 2); b = torch.empty(3, 1, 4)
//	(a + b).stride() == (1, 3, 3); (b + a).stride() == (4, 12, 1)
func TestIterStrides(t *testing.T) {
	c := newHostContext(t)
	mk := func(shape, strides []int) *Tensor {
		x, err := Empty(c, []int{2 * 3 * 4 * 5}, Float32, "cpu")
		if err != nil {
			t.Fatal(err)
		}
		return x.viewOf(shape, strides, 0)
	}
	v := mk([]int{3, 2}, []int{1, 3})
	x := mk([]int{2, 4, 3, 4}, []int{60, 5, 20, 1})
	a := mk([]int{3, 1, 4}, []int{1, 3, 3})
	b := mk([]int{3, 1, 4}, []int{4, 4, 1})
	for _, tc := range []struct {
		name string
		got  []int
		want []int // nil: contiguous
	}{
		{"-v", iterStrides(v.shape, v), []int{1, 3}},
		{"x * 2", iterStrides(x.shape, x, nil), []int{48, 4, 16, 1}},
		{"x.to(float64)", preserveStrides(x), []int{48, 4, 16, 1}},
		{"v.clone()", preserveStrides(v), []int{1, 3}},
		{"a + b", iterStrides(a.shape, a, b), []int{1, 3, 3}},
		{"b + a", iterStrides(a.shape, b, a), []int{4, 12, 1}},
		{"contiguous + broadcast", iterStrides([]int{2, 3}, mk([]int{2, 3}, []int{3, 1}), mk([]int{3}, []int{1})), []int{3, 1}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: strides %v, PyTorch's %v", tc.name, tc.got, tc.want)
		}
	}
}

// BenchmarkIterStrides is the layout decision's cost per new result: two
// contiguous inputs of one shape (the common case), a broadcast bias, and
// a transposed input.
func BenchmarkIterStrides(b *testing.B) {
	c := &Context{}
	mk := func(shape, strides []int) *Tensor {
		return &Tensor{ctx: c, dtype: Float32, shape: shape, strides: strides}
	}
	x := mk([]int{8, 1024, 768}, contiguousStrides([]int{8, 1024, 768}))
	bias := mk([]int{768}, []int{1})
	xt := mk([]int{8, 768, 1024}, []int{768 * 1024, 1, 768})
	for _, bc := range []struct {
		name string
		ins  []*Tensor
	}{{"contiguous", []*Tensor{x, x}}, {"broadcast", []*Tensor{x, bias}}, {"transposed", []*Tensor{xt}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				iterStrides(bc.ins[0].shape, bc.ins...)
			}
		})
	}
}
