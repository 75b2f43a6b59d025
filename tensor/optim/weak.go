package optim

import "weak"

// Weak returns a getter that holds o weakly: it returns o while something
// else holds it, nil once the Go collector has found it unreachable. It
// returns nil (no getter) for an Optimizer of another package, whose
// dynamic type it cannot name. memtrack holds the optimizers it tracks
// this way, as PyTorch's MemTracker holds them in a WeakIdKeyDictionary.
func Weak(o Optimizer) func() Optimizer {
	switch x := o.(type) {
	case *Adam:
		return weakGetter(x)
	case *SGD:
		return weakGetter(x)
	case *Adafactor:
		return weakGetter(x)
	case *HFAdafactor:
		return weakGetter(x)
	case *Adam8bit:
		return weakGetter(x)
	}
	return nil
}

// weakGetter holds p weakly and returns it as an Optimizer (a nil
// interface, not a nil *T, once it is gone).
func weakGetter[T any, P interface {
	*T
	Optimizer
}](p P) func() Optimizer {
	w := weak.Make((*T)(p))
	return func() Optimizer {
		if v := w.Value(); v != nil {
			return P(v)
		}
		return nil
	}
}
