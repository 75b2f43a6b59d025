package tensor

import "slices"

// Helpers of the loss and indexing kernels (nn_loss.go, index.go): they
// read operands into Go-heap slices (host scratch, not device memory),
// compute, and write the results back. Results are allocated before the
// computation by the op itself, with PyTorch's allocations; hostCompute
// then runs the computation on host memory (cpu, simulator with data), on
// host shadows of real-GPU tensors (writing changed results back), and not
// at all on a meta device.

// hostCompute runs f over ts (inputs and already allocated results): on
// their memory when host-accessible, through staging when one is on a
// real GPU, and not at all when one has no values (meta).
func hostCompute(fname string, ts []*Tensor, f func(sh []*Tensor)) error {
	live := ts[:0:0]
	for _, t := range ts {
		if t != nil {
			live = append(live, t)
		}
	}
	if anyOnGPU(live...) {
		return staged(contextOf(live...), fname, live, func(s *staging) error {
			sh := make([]*Tensor, len(ts))
			for i, t := range ts {
				if t != nil {
					sh[i] = s.shadowOf(t)
				}
			}
			f(sh)
			return contextOf(live...).interrupted(fname) // nothing is written back
		})
	}
	for _, t := range live {
		if !t.hasData() {
			return nil
		}
	}
	f(ts)
	return contextOf(live...).interrupted(fname) // the kernels stop early once interrupted
}

// getF64 returns t's elements in row-major order as float64s.
func getF64(t *Tensor) []float64 {
	out := make([]float64, 0, t.Numel())
	ld := loadF64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		out = append(out, ld(p))
		return true
	})
	return out
}

// getI64 returns t's elements in row-major order as int64s.
func getI64(t *Tensor) []int64 {
	out := make([]int64, 0, t.Numel())
	ld := loadI64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		out = append(out, ld(p))
		return true
	})
	return out
}

// getBool returns t's elements in row-major order as truth values.
func getBool(t *Tensor) []bool {
	out := make([]bool, 0, t.Numel())
	ld := loadBool[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		out = append(out, ld(p))
		return true
	})
	return out
}

// setF64 stores vals into t's elements in row-major order.
func setF64(t *Tensor, vals []float64) {
	st := storeF64[t.dtype]
	i := 0
	forEachElem(t, func(p elemPtr) bool {
		st(p, vals[i])
		i++
		return true
	})
}

// broadcastView returns t viewed with shape (t broadcast to it, stride 0 in
// the broadcast dimensions): a Go-side layout for reading, no allocation.
func broadcastView(t *Tensor, shape []int) *Tensor {
	if slices.Equal(t.shape, shape) {
		return t
	}
	v := t.viewOf(slices.Clone(shape), broadcastStrides(t, shape), t.offset)
	return v
}

// legacyTypeName is PyTorch's legacy tensor type name: "torch.cuda.LongTensor".
func legacyTypeName(t *Tensor) string {
	kind := map[DType]string{
		Float32: "FloatTensor", Float64: "DoubleTensor", Float16: "HalfTensor", BFloat16: "BFloat16Tensor",
		Int64: "LongTensor", Int32: "IntTensor", Int16: "ShortTensor", Int8: "CharTensor", Uint8: "ByteTensor", Bool: "BoolTensor",
	}[t.dtype]
	if len(t.mem.Device()) >= 4 && t.mem.Device()[:4] == "cuda" {
		return "torch.cuda." + kind
	}
	return "torch." + kind
}

// dtypeTitle is PyTorch's scalar type name: "Long", "Float".
func dtypeTitle(d DType) string {
	return map[DType]string{
		Float32: "Float", Float64: "Double", Float16: "Half", BFloat16: "BFloat16",
		Int64: "Long", Int32: "Int", Int16: "Short", Int8: "Char", Uint8: "Byte", Bool: "Bool",
	}[d]
}
