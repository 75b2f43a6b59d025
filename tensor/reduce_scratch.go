package tensor

import (
	"strings"

	"github.com/memsh/memsh/backend"
)

// CUDA reductions' scratch memory, as PyTorch's reduce kernel takes it.
//
// PyTorch's CUDA reduction (ATen/native/cuda/Reduce.cuh, gpu_reduce_kernel)
// chooses a launch configuration from the shape and the device
// (setReduceConfig), and when it splits each output's inputs across
// thread blocks (a "global reduce") it allocates, through the caching
// allocator and after the output, a staging buffer for the blocks'
// partial results and one int per output block column as semaphores;
// both are freed when the kernel has been launched, semaphores first. A
// bias gradient — the sum over the rows of a [R, C] gradient — takes
// that path: on an H100, for R = 1024, 6,291,456 + 24 bytes at C = 768,
// 18,874,368 + 72 at C = 2304 and 25,165,824 + 96 at C = 3072 (torch 2.11's
// allocator trace of a GPT-2 step, testdata/torchref/cuda). memsh
// allocates the same on simulated GPUs that know the card's
// multiprocessors (ReduceDevice: the presets), for the reductions it
// models: a contiguous input whose leading dimensions are summed and whose
// trailing ones are kept (the engine's sum_to of a broadcast gradient).
// Other reductions (over trailing dimensions, or of every element) get no
// scratch here: their staging is small or absent.

// ReduceDevice is implemented by a device whose multiprocessor count and
// resident threads per multiprocessor are known (backend/sim presets).
type ReduceDevice interface {
	Multiprocessors() (count, threadsPerSM int, ok bool)
}

// reduceScratch returns the staging and semaphore bytes of summing the
// r rows of a contiguous [r, c] input into c outputs, accumulating in
// acc-byte values, on a device with sms multiprocessors of tpsm resident
// threads each. It follows the launch configuration of PyTorch's
// reduce kernel for a reduction that is not along the fastest-moving
// dimension: outputs vectorised by up to 4 along the rows, a block of
// up to 32 × (512/vec / 32) threads, the inputs split across the block's
// rows when each thread would otherwise sum at least 16 values (or 256),
// and across blocks ("ctas per output") when each thread still has 256
// values or more and the grid is small.
func reduceScratch(r, c int64, acc int64, sms, tpsm int) (staging, semaphores int64) {
	if r <= 0 || c <= 0 {
		return 0, 0
	}
	vec := int64(4)
	for c%vec != 0 {
		vec /= 2
	}
	maxThreads := int64(512) / vec
	pow2 := func(x int64) int64 {
		if x >= maxThreads {
			return maxThreads
		}
		p := int64(1)
		for p*2 <= x {
			p *= 2
		}
		return p
	}
	dim0, dim1 := c/vec, r
	width := min(pow2(dim0), 32)
	height := min(pow2(dim1), maxThreads/width)
	width = min(pow2(dim0), maxThreads/height)
	threads := width * height
	stepOut, stepIn := width, int64(1) // the warp's lanes take outputs
	splitRows := false
	if perThread := ceilDiv(r, stepIn); perThread >= height*16 || perThread >= 256 {
		stepIn *= height // the block's rows split the inputs
		splitRows = true
	} else {
		stepOut *= height
	}
	grid := ceilDiv(c/vec, stepOut)
	perThread := ceilDiv(r, stepIn)
	target := int64(sms) * (int64(tpsm) / threads)
	if !splitRows || perThread < 256 || grid > target {
		return 0, 0
	}
	ctas := max(min(ceilDiv(target, grid), ceilDiv(perThread, 16)), ceilDiv(perThread, 256))
	if ctas <= 1 {
		return 0, 0
	}
	return acc * c * ctas * width * vec, 4 * grid
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// reductionScratch allocates and frees the scratch PyTorch's reduce
// kernel would take for summing t over dims (see above); call it after the
// output was allocated.
func reductionScratch(t *Tensor, dims []int) error {
	a := presetAllocator(t)
	if a == nil || !t.isContiguous() {
		return nil
	}
	_, d := t.ctx.deviceOf(t.Device())
	sms, tpsm, _ := d.(ReduceDevice).Multiprocessors()
	// Only leading dimensions reduced: rows R (their product) and
	// columns C (the rest).
	lead := len(dims)
	for i, d := range dims {
		if d != i {
			return nil
		}
	}
	if lead == 0 || lead == len(t.shape) {
		return nil
	}
	r, c := int64(1), int64(1)
	for i, s := range t.shape {
		if i < lead {
			r *= int64(s)
		} else {
			c *= int64(s)
		}
	}
	return takeReduceScratch(t.ctx, a, r, c, reduceAccBytes(t.dtype), sms, tpsm)
}

// reduceAccBytes is the size of the reduce kernel's accumulator for a sum
// of dtype dt: opmath float for float32, float16 and bfloat16; 8 bytes
// for float64 and the integer types.
func reduceAccBytes(dt DType) int64 {
	if dt == Float64 || !dt.IsFloat() {
		return 8
	}
	return 4
}

// takeReduceScratch allocates on a, then frees, the staging and semaphores
// of PyTorch's reduce kernel summing the r rows of an [r, c] input
// (reduceScratch), as the kernel's launch does; nothing when it needs
// none.
func takeReduceScratch(ctx *Context, a backend.Allocator, r, c, acc int64, sms, tpsm int) error {
	return takeReduceScratchLaw(ctx, a, reduceLaw{acc: acc, sms: sms, tpsm: tpsm}, r, c)
}

// takeReduceScratchLaw is takeReduceScratch with the law's arguments
// (args r, c for a reduceLaw; m, n for a layer norm's tile sums).
func takeReduceScratchLaw(ctx *Context, a backend.Allocator, law reduceLaw, r, c int64) error {
	staging, _ := law.Bytes([]int64{r, c})
	if staging == 0 {
		ctx.Manager.Guard(a, law, r, c) // none at this size; at others, maybe
		return nil
	}
	buf, err := ctx.Manager.AllocLaw(a, law, r, c)
	if err != nil {
		return err
	}
	law.semaphores = true
	// the staging buffer is reachable while the semaphores are allocated
	release := ctx.holdMemory(buf)
	s, err := ctx.Manager.AllocLaw(a, law, r, c)
	release()
	if err != nil {
		ctx.Manager.Release(buf, "reduction staging")
		return err
	}
	ctx.Manager.Release(s, "reduction semaphores")
	ctx.Manager.Release(buf, "reduction staging")
	return nil
}

// presetAllocator returns t's allocator when t is on a simulated GPU that
// models PyTorch's CUDA kernels' own allocations (a preset: ReduceDevice),
// or nil.
func presetAllocator(t *Tensor) backend.Allocator {
	if !strings.HasPrefix(t.Device(), "cuda") {
		return nil
	}
	a, d := t.ctx.deviceOf(t.Device())
	if rd, ok := d.(ReduceDevice); ok {
		if _, _, ok := rd.Multiprocessors(); ok {
			return a
		}
	}
	return nil
}

// cudaTemporary allocates nbytes on t's device when it models PyTorch's
// CUDA kernels (presetAllocator), for a temporary the CUDA kernel makes
// and the CPU one does not; release frees it. On other devices it does
// nothing.
func cudaTemporary(t *Tensor, nbytes uint64, what string) (release func(), err error) {
	return cudaTemporaryLaw(t, nil, nil, nbytes, what)
}

// cudaTemporaryLaw is cudaTemporary of law.Bytes(args) bytes (the size
// told to replays, backend.Manager.AllocLaw), or of nbytes without a law.
func cudaTemporaryLaw(t *Tensor, law backend.SizeLaw, args []int64, nbytes uint64, what string) (release func(), err error) {
	a := presetAllocator(t)
	if law != nil {
		nbytes, _ = law.Bytes(args)
	}
	if a == nil || nbytes == 0 {
		return func() {}, nil
	}
	var m *backend.Memory
	if law != nil {
		m, err = t.ctx.Manager.AllocLaw(a, law, args...)
	} else {
		m, err = t.ctx.Manager.AllocOn(a, nbytes)
	}
	if err != nil {
		return nil, err
	}
	unhold := t.ctx.holdMemory(m) // the reach walk sees it until released
	return func() { unhold(); t.ctx.Manager.Release(m, what) }, nil
}

// reduceLaw is the size of the staging buffer (or, with semaphores, of
// the semaphores) of the reduce kernel summing the r rows of an [r, c]
// input: args (r, c). A replay of a trial at another batch (backend/
// replay) predicts r and c and asks it: the sizes step with the launch's
// arithmetic, not as a polynomial.
type reduceLaw struct {
	acc        int64
	sms, tpsm  int
	semaphores bool
	// tiles: the arguments are a layer norm backward's rows and columns
	// (m, n), and the rows reduced its tile count (gammaBetaTiles)
	tiles bool
}

func (l reduceLaw) Bytes(args []int64) (uint64, bool) {
	if len(args) != 2 {
		return 0, false
	}
	r, c := args[0], args[1]
	if l.tiles {
		if r = int64(gammaBetaTiles(int(r), int(c), l.sms)); r == 0 {
			return 0, false
		}
	}
	staging, sem := reduceScratch(r, c, l.acc, l.sms, l.tpsm)
	if staging == 0 {
		return 0, false
	}
	if l.semaphores {
		return uint64(sem), true
	}
	return uint64(staging), true
}

// guard tells a replay of the trial at other sizes (backend/replay,
// through backend.Manager.Guard) that what the op allocates on t's GPU
// depends on its shapes through law (a kernel chosen by a count): at a
// size where law says otherwise, the replay runs the trial in full.
func guard(t *Tensor, law backend.SizeLaw, args ...int64) {
	if t == nil || t.ctx == nil || t.ctx.Manager == nil || !strings.HasPrefix(t.Device(), "cuda") {
		return
	}
	if a, _ := t.ctx.deviceOf(t.Device()); a != nil {
		t.ctx.Manager.Guard(a, law, args...)
	}
}

// overLaw is whether a count passes a kernel's threshold: args (n);
// Bytes is 1 when n > min, else 0.
type overLaw struct{ min int64 }

func (l overLaw) Bytes(args []int64) (uint64, bool) {
	if len(args) != 1 {
		return 0, false
	}
	if args[0] > l.min {
		return 1, true
	}
	return 0, true
}
