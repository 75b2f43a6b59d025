package dist

import (
	"errors"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// MixedPrecision is FSDP2's MixedPrecisionPolicy: ParamDType is the dtype
// the parameters are all-gathered and computed in, ReduceDType the
// gradients' reduce-scatter dtype (tensor.Undefined: not set; NoMixedPrecision
// sets neither).
type MixedPrecision struct {
	ParamDType, ReduceDType tensor.DType
}

// NoMixedPrecision is a MixedPrecisionPolicy that sets nothing.
var NoMixedPrecision = MixedPrecision{ParamDType: tensor.Undefined, ReduceDType: tensor.Undefined}

// CPUOffload is FSDP2's offload policy. Enabled is CPUOffloadPolicy: the
// padded shards, the sharded gradients and (the optimizer making them
// like the parameters) the optimizer states live in host memory and the
// optimizer steps on the CPU; each unshard copies the shards to the
// device first and each reduce-scatter's gradients are copied back.
// PinMemory is its pin_memory: the shards pinned (a host-to-host copy)
// and the gradients' copies non-blocking into pinned memory. Pinned
// memory is counted by the host allocator as any "cpu" tensor
// (PyTorch's CachingHostAllocator, which rounds and caches it, is not
// modelled).
type CPUOffload struct{ Enabled, PinMemory bool }

// FSDPParam is one parameter fully_shard manages (FSDPParam): a padded
// dim-0 shard of it kept between iterations, and between an unshard and
// a reshard the full parameter, a view of this rank's all-gather output.
type FSDPParam struct {
	shape []int
	dtype tensor.DType
	// s is the padded shard's numel: ceil(shape[0] / N) rows.
	s int
	// padded is the shard's storage, s elements of the parameter's dtype
	// (zero-filled past this rank's rows); Sharded, the parameter the
	// module holds between iterations, views its first rows.
	padded, Sharded *tensor.Tensor
	// buf is all_gather_outputs[0]: N × s elements of the compute dtype,
	// allocated at the first unshard, then resized to 0 bytes at each
	// reshard and back at each unshard. Unsharded, the parameter the
	// module holds while unsharded, is a leaf viewing its first elements.
	buf, Unsharded *tensor.Tensor
	// set puts a parameter on the modules that hold this one.
	set func(*tensor.Tensor) error
}

// newFSDPParam shards p for rank of n ranks (FSDPParam._init_sharded_param):
// chunk rows = ceil(d0 / n); the padded shard, rows × the rest, in p's
// dtype on every rank; this rank's rows [rank·rows, …) copied into its
// start. The original is freed once nothing holds it (fully_shard's
// caller lets go of it when fully_shard returns). With off, the padded
// shard is copied to the host (.cpu()) and the device one freed, then,
// with PinMemory, copied again into pinned memory and the first host copy
// freed; a shard made on the meta device stays there until to_empty
// (which must put it on the CPU).
func newFSDPParam(p *tensor.Tensor, rank, n int, set func(*tensor.Tensor) error, off CPUOffload) (*FSDPParam, error) {
	shape := p.Shape()
	if len(shape) == 0 {
		return nil, errors.New("fully_shard: a 0-dim parameter cannot be sharded on dim 0")
	}
	rows := (shape[0] + n - 1) / n
	pshape := append([]int{rows}, shape[1:]...)
	ctx := p.Context()
	var padded *tensor.Tensor
	mk := func() (err error) {
		padded, err = tensor.Zeros(ctx, pshape, p.DType(), p.Device())
		return err
	}
	var err error
	if tensor.Deferred(p) {
		// a model built on the meta device: the shard too, until to_empty
		err = tensor.MetaDevice(ctx, mk)
	} else {
		err = mk()
	}
	if err != nil {
		return nil, err
	}
	start, local := ChunkSize(shape[0], n, rank) // this rank's rows
	if local > 0 && p.HasData() {
		src, err := tensor.Narrow(p, 0, start, local)
		if err == nil {
			var dst *tensor.Tensor
			if dst, err = tensor.Narrow(padded, 0, 0, local); err == nil {
				_, err = dst.Copy_(src)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if off.Enabled && !tensor.Deferred(padded) {
		if padded, err = moveToHost(padded, off.PinMemory); err != nil {
			return nil, err
		}
	}
	sh, err := tensor.Narrow(padded, 0, 0, local)
	if err != nil {
		return nil, err
	}
	sh = tensor.Alias(sh)
	if err := asParameter(sh, autograd.RequiresGrad(p)); err != nil {
		return nil, err
	}
	fp := &FSDPParam{shape: shape, dtype: p.DType(), s: padded.Numel(), padded: padded, Sharded: sh, set: set}
	return fp, fp.set(sh)
}

// moveToHost is _init_sharded_param's offload: t.cpu(), then with pin
// .pin_memory(), each rebinding the name (the device shard, then the
// pageable copy, freed once the next exists).
func moveToHost(t *tensor.Tensor, pin bool) (*tensor.Tensor, error) {
	h, err := tensor.To(t, "cpu", tensor.Undefined, false)
	tensor.Dropped(t)
	if err != nil || !pin {
		return h, err
	}
	pinned, err := tensor.Clone(h)
	tensor.Dropped(h)
	return pinned, err
}

// asParameter makes t a leaf nn.Parameter.
func asParameter(t *tensor.Tensor, requiresGrad bool) error {
	if requiresGrad {
		if err := autograd.SetRequiresGrad(t, true); err != nil {
			return err
		}
	}
	t.EnsureAutograd().IsParameter = true
	return nil
}

// computeDType is the dtype the parameter is all-gathered in.
func (p *FSDPParam) computeDType(mp MixedPrecision) tensor.DType {
	if mp.ParamDType != tensor.Undefined {
		return mp.ParamDType
	}
	return p.dtype
}

// castsForAllGather: the all-gather input is a cast copy (param_dtype set
// and not the parameter's dtype: _init_mp_dtypes keeps it then).
func (p *FSDPParam) castsForAllGather(mp MixedPrecision) bool {
	return mp.ParamDType != tensor.Undefined && mp.ParamDType != p.dtype
}

// copyOut gives the parameter its unsharded buffer (a new tensor at the
// first unshard, its storage resized back after) and copies its part of
// the all-gather output out of out (viewed [n, S]) at column off
// (split_with_sizes_copy), then makes the unsharded parameter (once) and
// puts it on the modules. out is on the device the group computes on.
func (p *FSDPParam) copyOut(out *tensor.Tensor, n, off int, dt tensor.DType, requiresGrad bool) error {
	ctx := p.padded.Context()
	if p.buf == nil {
		b, err := tensor.Empty(ctx, []int{n * p.s}, dt, out.Device())
		if err != nil {
			return err
		}
		p.buf = b
	} else if err := tensor.AllocStorage(p.buf); err != nil {
		return err
	}
	if out.HasData() {
		src, err := tensor.View(out, []int{n, out.Numel() / n})
		if err == nil {
			src, err = tensor.Narrow(src, 1, off, p.s)
		}
		var dst *tensor.Tensor
		if err == nil {
			dst, err = tensor.View(p.buf, []int{n, p.s})
		}
		if err == nil {
			err = tensor.PreserveVersion(dst, func() error { _, err := dst.Copy_(src); return err })
		}
		if err != nil {
			return err
		}
	}
	if p.Unsharded == nil {
		numel := 1
		for _, d := range p.shape {
			numel *= d
		}
		v, err := tensor.Narrow(p.buf, 0, 0, numel)
		if err == nil {
			v, err = tensor.View(v, p.shape)
		}
		if err != nil {
			return err
		}
		v = tensor.Alias(v)
		if err := asParameter(v, requiresGrad); err != nil {
			return err
		}
		p.Unsharded = v
	}
	return p.set(p.Unsharded)
}

// free resizes the unsharded buffer to 0 bytes and puts the sharded
// parameter back on the modules (FSDPParam.to_sharded).
func (p *FSDPParam) free() error {
	if p.buf != nil && !tensor.StorageFreed(p.buf) {
		tensor.FreeStorage(p.buf, "resized to 0 bytes by FSDP's reshard (an unsharded parameter used outside its module's forward and backward)")
	}
	return p.set(p.Sharded)
}

// localNumel is this rank's rows of the shard, as elements.
func (p *FSDPParam) localNumel() int { return p.Sharded.Numel() }
