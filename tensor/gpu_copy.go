package tensor

import (
	"runtime"
	"slices"

	"github.com/memsh/memsh/backend/cuda"
)

// Copies to, from and between real GPUs: to(), cuda(), cpu(), clone(),
// contiguous(), float casts (copyTo) and copy_ (copyInto).

// gpuCopyTo is copyTo when the source or the target is a real GPU; it
// reports false otherwise. Contiguous copies of one dtype are single
// driver copies, float casts on one GPU a kernel; anything else converts
// through host copies.
func gpuCopyTo(fname string, src *Tensor, device string, dt DType) (*Tensor, bool, error) {
	srcDev := onGPU(src)
	dstDev, dstGPU := deviceOf(src.ctx, device)
	if srcDev == nil && !dstGPU {
		return nil, false, nil
	}
	if err := src.checkLive(fname); err != nil {
		return nil, true, err
	}
	out, err := newTensor(src.ctx, fname, device, dt, src.shape)
	if err != nil {
		return nil, true, err
	}
	if out.Numel() == 0 {
		return out, true, nil
	}
	done, err := directCopy(dstDev, out, srcDev, src)
	if !done && err == nil {
		err = stagedCopy(fname, out, src)
	}
	if err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	runtime.KeepAlive(src)
	return out, true, nil
}

// directCopy copies src into dst (same shape) without host staging when
// both are contiguous and either share the dtype (one driver copy) or are
// float dtypes on one GPU (the cast kernel). dstDev / srcDev are their
// GPUs, nil for host memory. It reports false when it cannot.
func directCopy(dstDev *cuda.Device, dst *Tensor, srcDev *cuda.Device, src *Tensor) (bool, error) {
	if !dst.isContiguous() || !src.isContiguous() || !slices.Equal(dst.shape, src.shape) {
		return false, nil
	}
	n := uint64(dst.NBytes())
	switch {
	case srcDev != nil && dstDev == srcDev && dst.dtype == src.dtype:
		return true, srcDev.CopyDtoD(devPtr(dst), devPtr(src), n)
	case srcDev != nil && dstDev == srcDev:
		dc, ok1 := cudaDType(dst.dtype)
		sc, ok2 := cudaDType(src.dtype)
		if !ok1 || !ok2 || !kernelsOK(srcDev) {
			return false, nil
		}
		return true, srcDev.Cast(dc, devPtr(dst), sc, devPtr(src), uint64(dst.Numel()))
	case srcDev != nil && dstDev == nil && dst.hasData() && dst.dtype == src.dtype:
		return true, srcDev.CopyDtoH(elemAddr(dst.mem.Pointer(), dst.offset, dst.dtype.Size()), devPtr(src), n)
	case srcDev == nil && dstDev != nil && src.hasData() && dst.dtype == src.dtype:
		return true, dstDev.CopyHtoD(devPtr(dst), elemAddr(src.mem.Pointer(), src.offset, src.dtype.Size()), n)
	}
	return false, nil
}

// stagedCopy converts src into the new tensor out through host copies,
// with the CPU's copy kernel.
func stagedCopy(fname string, out, src *Tensor) error {
	s := newStaging(src.ctx)
	defer s.close()
	if onGPU(out) != nil {
		if err := s.stageOutput(out); err != nil {
			return err
		}
	}
	if err := s.stageTensors([]*Tensor{src}); err != nil {
		return err
	}
	so, ss := s.shadowOf(out), s.shadowOf(src)
	if !ss.hasData() { // a meta source: the values are unknown; store zeros
		fillKernel(layoutOf(so, so.shape), so.dtype, 0, so.shape)
	} else {
		copyKernel(layoutOf(so, so.shape), so.dtype, layoutOf(ss, so.shape), ss.dtype, so.shape)
	}
	runtime.KeepAlive(so)
	runtime.KeepAlive(ss)
	return s.writeBack()
}

// nativeCopyInto is dst.copy_(src) when it is one direct copy (same shape,
// both contiguous, not overlapping; see directCopy).
func nativeCopyInto(fname string, dst, src *Tensor) (*Tensor, bool, error) {
	if dst.mem.Err() != nil || src.mem.Err() != nil || dst.mem == src.mem || dst.Numel() == 0 {
		return nil, false, nil
	}
	dstDev, srcDev := onGPU(dst), onGPU(src)
	if (dstDev == nil && !dst.hasData()) || (srcDev == nil && !src.hasData()) {
		return nil, false, nil
	}
	if dstDev != nil && srcDev != nil && dstDev != srcDev {
		return nil, false, nil
	}
	done, err := directCopy(dstDev, dst, srcDev, src)
	if !done {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	runtime.KeepAlive(src)
	return dst, true, nil
}
