package autograd_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// Post-accumulate-grad hooks run after the leaf's gradient is in .grad, in
// registration order; a hook may set the gradient to None (its memory is
// freed), a removed hook runs no more, and a hook's error ends the
// backward. Registration fails as PyTorch's does.
func TestPostAccumulateGradHooks(t *testing.T) {
	f := newFixture(t, true)
	must := mustT(t)
	w, b, err := tnn.NewLinearParams(f.ctx, 256, 128, true, "cuda:0", tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	x := must(tensor.Randn(f.ctx, []int{32, 256}, tensor.Float32, "cuda:0"))
	var log []string
	removeW1, err := autograd.RegisterPostAccumulateGradHook(w, func(v *tensor.Tensor) error {
		if autograd.Grad(v) == nil {
			t.Error("hook: no gradient in .grad yet")
		}
		log = append(log, "w1")
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := autograd.RegisterPostAccumulateGradHook(w, func(v *tensor.Tensor) error {
		log = append(log, "w2")
		return autograd.SetGrad(v, nil) // the fused step's zero_grad
	}, nil); err != nil {
		t.Fatal(err)
	}
	step := func() error {
		y, err := autograd.Linear(x, w, b)
		if err != nil {
			return err
		}
		loss, err := autograd.Sum(y, nil, false, tensor.Undefined)
		if err != nil {
			return err
		}
		return autograd.Backward([]*tensor.Tensor{loss}, nil, false)
	}
	params := round512(256*128*4) + round512(128*4)
	if err := step(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(log, " ") != "w1 w2" {
		t.Errorf("hooks ran %v, want w1 w2", log)
	}
	// w's gradient was set to None by its hook: only b's is left
	if autograd.Grad(w) != nil || autograd.Grad(b) == nil {
		t.Errorf("grads: w %v, b %v", autograd.Grad(w), autograd.Grad(b))
	}
	if got, want := f.allocated(), params+round512(32*256*4)+round512(128*4); got != want {
		t.Errorf("after backward: %d bytes, want %d (parameters, x, b's gradient)", got, want)
	}
	removeW1()
	removeW1()
	log = nil
	if err := step(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(log, " ") != "w2" {
		t.Errorf("after remove: hooks ran %v, want w2", log)
	}
	boom := errors.New("boom")
	if _, err := autograd.RegisterPostAccumulateGradHook(b, func(*tensor.Tensor) error { return boom }, nil); err != nil {
		t.Fatal(err)
	}
	if err := step(); !errors.Is(err, boom) {
		t.Errorf("backward with a failing hook: %v", err)
	}

	nonLeaf := must(autograd.MulScalar(w, tensor.Float(2)))
	if _, err := autograd.RegisterPostAccumulateGradHook(nonLeaf, func(*tensor.Tensor) error { return nil }, nil); err == nil || !strings.Contains(err.Error(), "non-leaf") {
		t.Errorf("non-leaf: %v", err)
	}
	plain := must(tensor.Zeros(f.ctx, []int{4}, tensor.Float32, "cuda:0"))
	if _, err := autograd.RegisterPostAccumulateGradHook(plain, func(*tensor.Tensor) error { return nil }, nil); err == nil || !strings.Contains(err.Error(), "doesn't require gradient") {
		t.Errorf("no grad: %v", err)
	}
}
