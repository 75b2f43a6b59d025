package tensor

import (
	"fmt"
	"hash/maphash"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
)

// Staging runs the CPU implementation of an operation on tensors of a real
// GPU (backend/cuda), whose memory the CPU cannot read: the fallback for
// every operation without a GPU kernel.
//
// A staging has its own backend.Manager (the stage manager) and a shadow
// Context that uses it (sharing the real Context's generator). Each GPU tensor argument is replaced by a shadow tensor
// over a host scratch copy of the part of its storage the arguments touch
// (one copy per storage, so views of one storage still overlap); other
// tensors keep their memory and get the shadow Context. The operation then runs
// unchanged. Its allocations go to the stage manager, whose allocators pair
// each one with a real allocation made through the Session's Manager at the
// same moment — so figures, peaks, events and out-of-memory errors are those
// of a GPU implementation — plus host scratch for the CPU kernels. After the
// operation the results are mapped back: a new GPU tensor's scratch is
// uploaded into its paired device memory; a staged input that the operation
// changed (in place, out=, item assignment) is written back; shadows of
// inputs become the inputs again. Closing the staging frees all scratch and
// every paired allocation no result adopted. Host scratch is anonymous mmap,
// outside the Go heap, freed at once; it shows in host RSS while it lives.
type staging struct {
	real      *Context
	shadow    *Context
	mgr       *backend.Manager // the stage manager
	gpus      map[backend.Allocator]*stageGPU
	blocks    map[uintptr]*stageBlock       // stage allocations with memory, by block address
	inputs    map[*backend.Memory]*stagedIn // staged GPU storages, by real memory
	byStage   map[*backend.Memory]*stagedIn // the same, by stage memory
	shadows   map[*Tensor]*Tensor           // shadow -> original argument
	shadowFor map[*Tensor]*Tensor           // original argument -> shadow
	reals     map[*backend.Memory]bool      // memories of arguments that were not staged
	seed      maphash.Seed
	staging   bool // allocating scratch for inputs: no paired device memory
}

// stageBlock is one stage allocation with memory.
type stageBlock struct {
	scratch []byte          // host scratch (nil for host allocations, which are real memory)
	real    *backend.Memory // paired real allocation; nil for staged inputs
	adopted bool            // a result took real: do not release it
	st      *Storage        // the Storage of the results over real
}

// stagedIn is a GPU storage copied to the host.
type stagedIn struct {
	real *backend.Memory
	dev  *cuda.Device
	lo   uint64 // first byte of the copied span in real
	n    uint64 // bytes copied
	sum  uint64 // hash of the bytes after the copy
	// force: write back whatever the bytes (an output staged without
	// copying its bytes in)
	force bool
	mem   *backend.Memory
	st    *Storage // the shadow storage over mem
	orig  *Storage // the real tensor's storage
}

func newStaging(e *Context) *staging {
	s := &staging{
		real: e, gpus: map[backend.Allocator]*stageGPU{}, blocks: map[uintptr]*stageBlock{},
		inputs: map[*backend.Memory]*stagedIn{}, byStage: map[*backend.Memory]*stagedIn{},
		shadows: map[*Tensor]*Tensor{}, shadowFor: map[*Tensor]*Tensor{}, reals: map[*backend.Memory]bool{}, seed: maphash.MakeSeed(),
	}
	m := e.Manager
	gpus := make([]backend.Allocator, m.NumGPUs())
	for i := range gpus {
		a := &stageGPU{s: s, real: m.GPU(i)}
		a.dev = stageDevice{real: m.GPU(i).Device()}
		s.gpus[m.GPU(i)] = a
		gpus[i] = a
	}
	s.mgr = backend.NewManager(backend.Config{GPUs: gpus, Host: &stageHost{s: s, real: m.Host()}, Peak: backend.PeakLazy, Pacing: 1 << 62})
	s.shadow = e.withManager(s.mgr)
	return s
}

// close frees every stage allocation and every paired allocation that no
// result adopted.
func (s *staging) close() { s.mgr.Close() }

// stageTensors makes the shadows of ts (tensors of any device; nil entries
// are skipped), copying GPU storages to the host once each.
func (s *staging) stageTensors(ts []*Tensor) error {
	type group struct {
		dev    *cuda.Device
		lo, hi int // element span; lo > hi when no element is touched
		size   int
		st     *Storage
	}
	groups := map[*backend.Memory]*group{}
	var order []*backend.Memory
	for _, t := range ts {
		if t == nil || s.shadowFor[t] != nil {
			continue
		}
		dev := onGPU(t)
		if dev == nil || t.mem.Err() != nil {
			continue
		}
		g := groups[t.mem]
		if g == nil {
			g = &group{dev: dev, lo: 1, hi: 0, size: t.dtype.Size(), st: t.st}
			groups[t.mem] = g
			order = append(order, t.mem)
		}
		if t.Numel() > 0 {
			lo, hi := t.span()
			if g.lo > g.hi {
				g.lo, g.hi = lo, hi
			} else {
				g.lo, g.hi = min(g.lo, lo), max(g.hi, hi)
			}
		}
	}
	for _, m := range order {
		if s.inputs[m] != nil {
			continue
		}
		g := groups[m]
		var lo, n uint64
		if g.lo <= g.hi {
			lo, n = uint64(g.lo*g.size), uint64((g.hi-g.lo+1)*g.size)
		}
		a, err := s.real.Manager.Allocator(m.Device())
		if err != nil {
			return err
		}
		s.staging = true
		sm, err := s.mgr.AllocOn(s.gpus[a], n)
		s.staging = false
		if err != nil {
			return err
		}
		in := &stagedIn{real: m, dev: g.dev, lo: lo, n: n, mem: sm, orig: g.st}
		if n > 0 {
			if err := g.dev.CopyDtoH(sm.Pointer(), m.Ptr()+uintptr(lo), n); err != nil {
				return err
			}
			in.sum = maphash.Bytes(s.seed, sm.Bytes())
		}
		s.inputs[m], s.byStage[sm] = in, in
	}
	for _, t := range ts {
		if t == nil || s.shadowFor[t] != nil {
			continue
		}
		sh := &Tensor{ctx: s.shadow, st: t.st, mem: t.mem, dtype: t.dtype, shape: t.shape, strides: t.strides, offset: t.offset, view: t.view}
		if in := s.inputs[t.mem]; in != nil {
			sh.st, sh.mem = s.stageStorage(in), in.mem
			if t.Numel() > 0 {
				sh.offset = t.offset - int(in.lo)/t.dtype.Size()
			} else {
				sh.offset = 0
			}
		} else {
			s.reals[t.mem] = true
		}
		s.shadows[sh], s.shadowFor[t] = t, sh
	}
	return nil
}

// shadowOf returns the shadow of an argument staged by stageTensors (t
// itself for anything else).
func (s *staging) shadowOf(t *Tensor) *Tensor {
	if sh := s.shadowFor[t]; sh != nil {
		return sh
	}
	return t
}

// stageOutput makes the shadow of a new GPU tensor the caller will fill
// completely: scratch without copying the device's bytes in, always
// written back.
func (s *staging) stageOutput(t *Tensor) error {
	a, err := s.real.Manager.Allocator(t.mem.Device())
	if err != nil {
		return err
	}
	dev := onGPU(t)
	s.staging = true
	sm, err := s.mgr.AllocOn(s.gpus[a], t.mem.Size())
	s.staging = false
	if err != nil {
		return err
	}
	in := &stagedIn{real: t.mem, dev: dev, n: t.mem.Size(), mem: sm, force: true, orig: t.st}
	s.inputs[t.mem], s.byStage[sm] = in, in
	sh := &Tensor{ctx: s.shadow, st: s.stageStorage(in), mem: sm, dtype: t.dtype, shape: t.shape, strides: t.strides, offset: t.offset, view: t.view}
	s.shadows[sh], s.shadowFor[t] = t, sh
	return nil
}

// stageStorage returns the one shadow Storage of a staged storage (views
// of one storage share it).
func (s *staging) stageStorage(in *stagedIn) *Storage {
	if in.st == nil {
		in.st = newStorage(in.mem)
	}
	return in.st
}

// stagePrinted makes the shadow of t for printing a summary: scratch for
// t's whole span (untouched pages cost nothing) into which only the
// elements str() shows are copied. It is never written back.
func (s *staging) stagePrinted(t *Tensor) error {
	dev := onGPU(t)
	a, err := s.real.Manager.Allocator(t.mem.Device())
	if err != nil {
		return err
	}
	size := t.dtype.Size()
	lo, hi := t.span()
	s.staging = true
	sm, err := s.mgr.AllocOn(s.gpus[a], uint64((hi-lo+1)*size))
	s.staging = false
	if err != nil {
		return err
	}
	nd := len(t.shape)
	shown := make([][]int, nd)
	for d, n := range t.shape {
		shown[d] = shownIndices(n, true)
	}
	var walk func(d, off int) error
	walk = func(d, off int) error {
		if d == nd {
			rel := uint64((off - lo) * size)
			return dev.CopyDtoH(unsafe.Add(sm.Pointer(), rel), t.mem.Ptr()+uintptr(off*size), uint64(size))
		}
		for _, i := range shown[d] {
			if i < 0 {
				continue
			}
			if err := walk(d+1, off+i*t.strides[d]); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(0, t.offset); err != nil {
		return err
	}
	in := &stagedIn{real: t.mem, dev: dev, lo: uint64(lo * size), mem: sm, orig: t.st} // n 0: never written back
	s.inputs[t.mem], s.byStage[sm] = in, in
	sh := &Tensor{ctx: s.shadow, st: s.stageStorage(in), mem: sm, dtype: t.dtype, shape: t.shape, strides: t.strides, offset: t.offset - lo, view: t.view}
	s.shadows[sh], s.shadowFor[t] = t, sh
	return nil
}

// writeBack uploads every staged storage the operation changed.
func (s *staging) writeBack() error {
	for _, in := range s.inputs {
		if in.n == 0 || (!in.force && maphash.Bytes(s.seed, in.mem.Bytes()) == in.sum) {
			continue
		}
		if err := in.dev.CopyHtoD(in.real.Ptr()+uintptr(in.lo), in.mem.Pointer(), in.n); err != nil {
			return err
		}
	}
	return nil
}

// mapTensor maps one result tensor back to real memory.
func (s *staging) mapTensor(r *Tensor) (*Tensor, error) {
	if orig, ok := s.shadows[r]; ok {
		return orig, nil
	}
	out := &Tensor{ctx: s.real, st: r.st, mem: r.mem, dtype: r.dtype, shape: r.shape, strides: r.strides, offset: r.offset, view: r.view}
	switch {
	case s.reals[r.mem]:
		// A view of an argument that kept its memory (and Storage).
	case s.byStage[r.mem] != nil:
		in := s.byStage[r.mem]
		out.st, out.mem, out.offset = in.orig, in.real, r.offset+int(in.lo)/r.dtype.Size()
	case r.mem.Size() == 0:
		m, err := s.real.Manager.Alloc(r.mem.Device(), 0)
		if err != nil {
			return nil, err
		}
		out.st, out.mem = newStorage(m), m
	default:
		b := s.blocks[r.mem.Ptr()]
		if b == nil || b.real == nil {
			return nil, fmt.Errorf("tensor: internal error: a GPU operation returned memory it did not allocate")
		}
		if !b.adopted && b.scratch != nil {
			dev, _ := deviceOf(s.real, b.real.Device())
			if err := dev.CopyHtoD(b.real.Ptr(), unsafe.Pointer(&b.scratch[0]), b.real.Size()); err != nil {
				return nil, err
			}
		}
		b.adopted = true
		if b.st == nil {
			b.st = newStorage(b.real)
		}
		out.st, out.mem = b.st, b.real
	}
	return out, nil
}

// stageGPU is the stage manager's allocator for one GPU: host scratch,
// paired (outside input staging) with a real allocation on the GPU.
type stageGPU struct {
	s     *staging
	real  backend.Allocator
	dev   stageDevice
	peaks backend.PeakSet
}

func (a *stageGPU) Device() backend.Device { return &a.dev }

func (a *stageGPU) Malloc(size uint64) (*backend.Block, error) {
	if size == 0 {
		return &backend.Block{}, nil
	}
	var real *backend.Memory
	if !a.s.staging {
		m, err := a.s.real.Manager.AllocOn(a.real, size)
		if err != nil {
			return nil, err
		}
		real = m
	}
	scratch, err := mapScratch(size)
	if err != nil {
		if real != nil {
			a.s.real.Manager.Release(real, "freed: host scratch for a GPU operation could not be mapped")
		}
		return nil, fmt.Errorf("host scratch of %s for a GPU operation: %v", backend.FormatSize(size), err)
	}
	b := &backend.Block{Ptr: uintptr(unsafe.Pointer(&scratch[0])), Host: scratch, Size: size, Requested: size}
	a.s.blocks[b.Ptr] = &stageBlock{scratch: scratch, real: real}
	return b, nil
}

func (a *stageGPU) TryMalloc(size uint64) (*backend.Block, error) { return a.Malloc(size) }

func (a *stageGPU) Free(b *backend.Block) {
	sb := a.s.blocks[b.Ptr]
	if sb == nil || b.Size == 0 {
		return
	}
	delete(a.s.blocks, b.Ptr)
	unmapScratch(sb.scratch)
	if sb.real != nil && !sb.adopted {
		a.s.real.Manager.Release(sb.real, "freed: a temporary of a GPU operation")
	}
}

func (a *stageGPU) RoundSize(size uint64) uint64 { return size }
func (a *stageGPU) Allocated() uint64            { return 0 }
func (a *stageGPU) Reserved() uint64             { return 0 }
func (a *stageGPU) EmptyCache()                  {}
func (a *stageGPU) Stats() map[string]int64      { return map[string]int64{} }
func (a *stageGPU) ResetPeakStats()              {}
func (a *stageGPU) Peaks() *backend.PeakSet      { return &a.peaks }

// stageDevice names a stage allocator after its GPU ("cuda:0"), so that
// shadows report the GPU's device string.
type stageDevice struct{ real backend.Device }

func (d *stageDevice) Name() string                        { return d.real.Name() }
func (d *stageDevice) Description() string                 { return d.real.Description() }
func (d *stageDevice) Kind() string                        { return "stage" }
func (d *stageDevice) MemGetInfo() (uint64, uint64, error) { return d.real.MemGetInfo() }
func (d *stageDevice) Malloc(uint64) (backend.DeviceMem, error) {
	return backend.DeviceMem{}, fmt.Errorf("stage device: no raw allocations")
}
func (d *stageDevice) Free(backend.DeviceMem, uint64) error { return nil }

// stageHost is the stage manager's host allocator: real host memory from
// the Session's Manager, handed to the operation directly.
type stageHost struct {
	s     *staging
	real  backend.Allocator
	peaks backend.PeakSet
}

func (a *stageHost) Device() backend.Device { return a.real.Device() }

func (a *stageHost) Malloc(size uint64) (*backend.Block, error) {
	if size == 0 {
		return &backend.Block{}, nil
	}
	m, err := a.s.real.Manager.AllocOn(a.real, size)
	if err != nil {
		return nil, err
	}
	b := &backend.Block{Ptr: m.Ptr(), Host: m.Bytes(), Size: size, Requested: size}
	a.s.blocks[b.Ptr] = &stageBlock{real: m}
	return b, nil
}

func (a *stageHost) TryMalloc(size uint64) (*backend.Block, error) { return a.Malloc(size) }

func (a *stageHost) Free(b *backend.Block) {
	sb := a.s.blocks[b.Ptr]
	if sb == nil || b.Size == 0 {
		return
	}
	delete(a.s.blocks, b.Ptr)
	if !sb.adopted {
		a.s.real.Manager.Release(sb.real, "freed: a temporary of a GPU operation")
	}
}

func (a *stageHost) RoundSize(size uint64) uint64 { return size }
func (a *stageHost) Allocated() uint64            { return 0 }
func (a *stageHost) Reserved() uint64             { return 0 }
func (a *stageHost) EmptyCache()                  {}
func (a *stageHost) Stats() map[string]int64      { return map[string]int64{} }
func (a *stageHost) ResetPeakStats()              {}
func (a *stageHost) Peaks() *backend.PeakSet      { return &a.peaks }

// mapScratch maps n bytes of anonymous memory (untouched pages cost
// nothing).
func mapScratch(n uint64) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmapScratch(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b)))
	}
}
