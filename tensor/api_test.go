package tensor_test

import (
	"slices"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
)

func newContext(t *testing.T) *tensor.Context {
	return newSimContext(t, sim.Spec{Count: 1, Total: 1 << 30}, backend.PeakExact)
}

// newSimContext returns a Context over one simulated GPU of spec sp and
// the host, in peak mode peak.
func newSimContext(t *testing.T, sp sim.Spec, peak backend.PeakMode) *tensor.Context {
	t.Helper()
	dev := sim.New(sp)[0]
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(dev, 0)}, Host: host.NewAllocator(), Peak: peak})
	t.Cleanup(m.Close)
	return tensor.NewContext(m)
}

func TestGoAPI(t *testing.T) {
	c := newContext(t)
	a, err := tensor.FromFloat64s(c, []float64{1, 2, 3, 4, 5, 6}, []int{2, 3}, tensor.Undefined, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		op    func() (*tensor.Tensor, error)
		shape []int
		dt    tensor.DType
		vals  []float64
	}{
		{"add scalar", func() (*tensor.Tensor, error) { return tensor.Add(a, tensor.Int(1)) }, []int{2, 3}, tensor.Float32, []float64{2, 3, 4, 5, 6, 7}},
		{"scalar sub", func() (*tensor.Tensor, error) { return tensor.Sub(tensor.Float(10), a) }, []int{2, 3}, tensor.Float32, []float64{9, 8, 7, 6, 5, 4}},
		{"mul", func() (*tensor.Tensor, error) { return tensor.Mul(a, a) }, []int{2, 3}, tensor.Float32, []float64{1, 4, 9, 16, 25, 36}},
		{"transpose", func() (*tensor.Tensor, error) { return tensor.Transpose(a, 0, 1) }, []int{3, 2}, tensor.Float32, []float64{1, 4, 2, 5, 3, 6}},
		{"sum dim", func() (*tensor.Tensor, error) { return tensor.Sum(a, []int{-1}, false, tensor.Undefined) }, []int{2}, tensor.Float32, []float64{6, 15}},
		{"matmul", func() (*tensor.Tensor, error) {
			at, _ := tensor.T(a)
			return tensor.Matmul(a, at)
		}, []int{2, 2}, tensor.Float32, []float64{14, 32, 32, 77}},
		{"to int64", func() (*tensor.Tensor, error) { return tensor.To(a, "cuda", tensor.Int64, false) }, []int{2, 3}, tensor.Int64, []float64{1, 2, 3, 4, 5, 6}},
		{"cat", func() (*tensor.Tensor, error) { return tensor.Cat([]*tensor.Tensor{a, a}, 0) }, []int{4, 3}, tensor.Float32, []float64{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}},
		{"gt", func() (*tensor.Tensor, error) { return tensor.Gt(a, tensor.Int(3)) }, []int{2, 3}, tensor.Bool, []float64{0, 0, 0, 1, 1, 1}},
	} {
		r, err := tc.op()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got, err := r.ToFloat64s()
		if err != nil || !slices.Equal(r.Shape(), tc.shape) || r.DType() != tc.dt || !slices.Equal(got, tc.vals) {
			t.Errorf("%s: got %v %s %v (%v), want %v %s %v", tc.name, r.Shape(), r.DType(), got, err, tc.shape, tc.dt, tc.vals)
		}
	}
}

func TestVersionCounter(t *testing.T) {
	c := newContext(t)
	a, _ := tensor.Zeros(c, []int{4}, tensor.Float32, "cpu")
	v, _ := tensor.Narrow(a, 0, 1, 2)
	if v.Storage() != a.Storage() {
		t.Fatal("a view has its own Storage")
	}
	if _, err := v.Add_(tensor.Int(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Fill_(tensor.Float(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := tensor.Add(a, a); err != nil {
		t.Fatal(err)
	}
	if a.Version() != 2 || v.Version() != 2 {
		t.Errorf("versions %d %d, want 2 2", a.Version(), v.Version())
	}
}

func TestErrorNames(t *testing.T) {
	c := newContext(t)
	a, _ := tensor.Zeros(c, []int{2, 3}, tensor.Float32, "")
	b, _ := tensor.Zeros(c, []int{3}, tensor.Float32, "cuda:0")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{func() error { _, err := tensor.Add(a, b); return err }(), "tensor.add: expected all tensors to be on the same device, but found at least two devices, cpu and cuda:0"},
		{func() error { _, err := tensor.View(a, []int{4, -1}); return err }(), "tensor.view: shape '[4, -1]' is invalid for input of size 6"},
		{tensor.Renamed(func() error { _, err := tensor.To(a, "cuda:7", tensor.Undefined, false); return err }(), "tensor.cuda"), "tensor.cuda: invalid device \"cuda:7\": 1 CUDA device available"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("got %v, want %s", tc.err, tc.want)
		}
	}
}
