package tensor

import "runtime"

// Reading values. These copy a real GPU's values to the host first and
// fail on a meta device ("tensor.item: device cuda:0 is meta: values are
// not stored") and on released memory.

// NeedData returns "op: ..." unless t is live and its values can be read
// (directly or, on a real GPU, through a host copy).
func (t *Tensor) NeedData(op string) error {
	if onGPU(t) != nil {
		return t.checkLive(op)
	}
	return t.needData(op)
}

// Item is Tensor.item: the value of a one-element tensor.
func (t *Tensor) Item() (Scalar, error) {
	const fname = "tensor.item"
	if onGPU(t) != nil {
		var v Scalar
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			v, err = item(fname, s.shadowOf(t))
			return err
		})
		return v, err
	}
	return item(fname, t)
}

// Values returns the elements in row-major order (Tensor.tolist,
// flattened), each a Scalar of t's dtype.
func (t *Tensor) Values() ([]Scalar, error) {
	const fname = "tensor.tolist"
	if onGPU(t) != nil {
		var v []Scalar
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			v, err = values(fname, s.shadowOf(t))
			return err
		})
		return v, err
	}
	return values(fname, t)
}

// ToFloat64s returns the elements in row-major order as float64s.
func (t *Tensor) ToFloat64s() ([]float64, error) {
	vs, err := t.Values()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = v.f
	}
	return out, nil
}

// Contains reports whether some element equals x (Python's "x in t").
func Contains(t *Tensor, x Scalar) (bool, error) {
	const fname = "tensor.__contains__"
	if onGPU(t) != nil {
		var found bool
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			found, err = contains(fname, s.shadowOf(t), x)
			return err
		})
		return found, err
	}
	return contains(fname, t, x)
}

func contains(fname string, t *Tensor, x Scalar) (bool, error) {
	if err := t.needData(fname); err != nil {
		return false, err
	}
	f := x.f
	found := false
	load := loadF64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		found = load(p) == f
		return !found
	})
	runtime.KeepAlive(t)
	return found, nil
}
