package tensor

import (
	"runtime"
	"unsafe"
)

// ArgMax is torch.argmax(t, dim, keepdim): the int64 indices of the
// largest values along dim (the first of equal ones), and only they are
// allocated on t's device — PyTorch's argmax kernel writes no values. The
// values are computed in host scratch (Go memory, no device figure).
func ArgMax(t *Tensor, dim int, keepdim bool) (*Tensor, error) {
	const fname = "tensor.argmax"
	if onGPU(t) != nil {
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return argmax(fname, s.shadowOf(t), dim, keepdim)
		})
	}
	return argmax(fname, t, dim, keepdim)
}

func argmax(fname string, t *Tensor, dim int, keepdim bool) (*Tensor, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	red, err := dimSet(fname, []int{dim}, len(t.shape))
	if err != nil {
		return nil, err
	}
	for d, r := range red {
		if r && t.shape[d] == 0 {
			return nil, errorf(fname, "Expected reduction dim %d to have non-zero size.", d)
		}
	}
	shape := reducedShape(t.shape, red, keepdim)
	idx, err := newTensor(t.ctx, fname, t.mem.Device(), Int64, shape)
	if err != nil {
		return nil, err
	}
	if idx.hasData() && idx.Numel() > 0 && t.hasData() {
		scratch := make([]byte, idx.Numel()*t.dtype.Size())
		reduceKernel(redMax, t, red, unsafe.Pointer(unsafe.SliceData(scratch)), t.dtype, idx.mem.Pointer())
		runtime.KeepAlive(scratch)
	}
	runtime.KeepAlive(t)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return idx, nil
}
