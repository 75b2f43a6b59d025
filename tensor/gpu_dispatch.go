package tensor

import "github.com/memsh/memsh/backend/cuda"

// Tensors on real GPUs (backend/cuda): their memory is not host-accessible,
// so every op that touches values decides here, below any binding, how to
// run. An op with a GPU kernel (gpu_native.go: contiguous float
// elementwise arithmetic, relu/neg/abs/sqrt, fills, rand/randn, sum over
// all elements, float32 matmul through cuBLAS, copies and float casts) runs
// on the device; every other one runs its CPU implementation on host
// shadows of its GPU operands (gpu_stage.go) and its results are moved
// back, with the same allocations on the device as a GPU implementation
// would make. Metadata ops (views) need neither.
//
// The pattern of a public op that touches values:
//
//	if anyOnGPU(ins...) {
//		if r, ok, err := nativeX(...); ok { return r, err }
//		return stagedTensor(ctx, fname, ins, func(s *staging) (*Tensor, error) {
//			return x(s.shadowOf(a), ...) // the CPU implementation
//		})
//	}
//	return x(a, ...)
//
// Shadows live in the staging's own Manager, whose allocators are not real
// GPUs, so the CPU implementation never dispatches again.

// onGPU returns the real GPU a tensor is stored on, or nil (CPU, simulator,
// or a shadow made by staging).
func onGPU(t *Tensor) *cuda.Device {
	if t == nil || (t.mem.Size() > 0 && t.mem.HostAccessible()) {
		return nil
	}
	d, _ := deviceOf(t.ctx, t.mem.Device())
	return d
}

// deviceOf returns the real GPU behind a device string of c's Manager.
func deviceOf(c *Context, device string) (*cuda.Device, bool) {
	a, err := c.Manager.Allocator(device)
	if err != nil {
		return nil, false
	}
	d, ok := a.Device().(*cuda.Device)
	return d, ok
}

// IsRealGPU reports whether device (a device string of c's Manager) is a
// real GPU, whose values the host cannot read directly.
func (c *Context) IsRealGPU(device string) bool {
	d, err := c.Manager.Canonical(device)
	if err != nil {
		return false
	}
	_, ok := deviceOf(c, d)
	return ok
}

// anyOnGPU reports whether one of ts (nil entries skipped) is on a real
// GPU.
func anyOnGPU(ts ...*Tensor) bool {
	for _, t := range ts {
		if onGPU(t) != nil {
			return true
		}
	}
	return false
}

// contextOf returns the Context of the first tensor of ts that is on a
// real GPU (else of the first tensor).
func contextOf(ts ...*Tensor) *Context {
	var c *Context
	for _, t := range ts {
		if t == nil {
			continue
		}
		if onGPU(t) != nil {
			return t.ctx
		}
		if c == nil {
			c = t.ctx
		}
	}
	return c
}

// staged runs op on host shadows of ins (nil entries skipped): op reads
// them with s.shadowOf and maps its results back with s.back; changed
// GPU inputs are then written back.
func staged(c *Context, fname string, ins []*Tensor, op func(s *staging) error) error {
	s := newStaging(c)
	defer s.close()
	if err := s.stageTensors(ins); err != nil {
		return errorf(fname, "%w", err)
	}
	if err := op(s); err != nil {
		return err
	}
	if err := s.writeBack(); err != nil {
		return errorf(fname, "%w", err)
	}
	return nil
}

// stagedTensor is staged for an op with one tensor result.
func stagedTensor(c *Context, fname string, ins []*Tensor, op func(s *staging) (*Tensor, error)) (*Tensor, error) {
	var out *Tensor
	err := staged(c, fname, ins, func(s *staging) error {
		r, err := op(s)
		if err != nil {
			return err
		}
		out, err = s.back(fname, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// back maps a result of a staged op back to real memory (nil stays nil).
func (s *staging) back(fname string, r *Tensor) (*Tensor, error) {
	if r == nil {
		return nil, nil
	}
	m, err := s.mapTensor(r)
	if err != nil {
		return nil, errorf(fname, "%w", err)
	}
	return m, nil
}

// shadowOp returns o with its tensor replaced by its shadow.
func (s *staging) shadowOp(o operand) operand {
	if o.t != nil {
		o.t = s.shadowOf(o.t)
	}
	return o
}

// gpuString formats a GPU tensor from a host copy of its values.
func gpuString(t *Tensor) (string, bool) {
	if onGPU(t) == nil || t.mem.Err() != nil {
		return "", false
	}
	s := newStaging(t.ctx)
	defer s.close()
	stage := func() error { return s.stageTensors([]*Tensor{t}) }
	if t.Numel() > printThreshold {
		stage = func() error { return s.stagePrinted(t) } // only what the summary shows
	}
	if err := stage(); err != nil {
		return "", false
	}
	return formatTensor(s.shadowOf(t)), true
}
