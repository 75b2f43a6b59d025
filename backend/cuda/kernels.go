package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"unsafe"
)

//go:generate sh -c "clang-14 -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_52 -O2 -ffp-contract=off -S -o kernels.ptx kernels.cu"

// ptx is kernels.cu compiled to PTX (ISA 4.1, sm_52: the driver
// JIT-compiles it for the GPU at hand, any architecture from Maxwell on).
//
//go:embed kernels.ptx
var ptx string

//go:embed kernels.cu
var kernelSource string

// PTX returns the embedded PTX module.
func PTX() string { return ptx }

// KernelSource returns kernels.cu, the source of the embedded PTX; the
// tests compile it into the stub driver to run the kernels on the CPU.
func KernelSource() string { return kernelSource }

// DType is a kernel element type.
type DType int

// The kernels' dtypes (DT_* in kernels.cu).
const (
	F32  DType = 0 // float32
	F16  DType = 1 // IEEE float16
	BF16 DType = 2 // bfloat16
	F64  DType = 3 // float64
)

// Size is the element size in bytes.
func (t DType) Size() int {
	switch t {
	case F16, BF16:
		return 2
	case F64:
		return 8
	}
	return 4
}

// BinaryOp is an elementwise binary operation (OP_* in kernels.cu).
type BinaryOp int

const (
	Add BinaryOp = iota
	Sub
	Mul
	Div
)

// UnaryOp is an elementwise unary operation (U_* in kernels.cu).
type UnaryOp int

const (
	Neg UnaryOp = iota
	Abs
	Relu
	Sqrt
)

// Operand is an input of Binary: an array read with broadcasting, or a
// number.
type Operand struct {
	Ptr uintptr // device address of element 0 (arrays)
	// Output element i reads element (i / Div) % Mod of the array, where
	// Div <= 1 means no division and Mod 0 no modulo: a contiguous array
	// of the output's shape is {Div: 1}; a row of m elements repeated is
	// {Div: 1, Mod: m}; a column repeated over rows of m is {Div: m}.
	Div, Mod uint64
	Number   bool    // use Value instead of an array
	Value    float64 // the number (used as float32 for the 32- and 16-bit dtypes)
}

const (
	blockSize   = 256
	maxBlocks   = 8192
	maxPartials = 65536 // Sum's threads, and its workspace in float64 values
)

// loadModuleLocked loads the embedded PTX into the context (d.mu held).
func (d *Device) loadModuleLocked() {
	if d.module != nil || d.moduleErr != nil {
		return
	}
	mod, log, err := d.drv.moduleLoad(d.ctx, ptx)
	if err != nil {
		if log != "" {
			err = fmt.Errorf("%w; JIT log: %s", err, log)
		}
		d.moduleErr = fmt.Errorf("loading memsh's kernels: %w", err)
		return
	}
	d.module = mod
}

// kernel returns the context and the function of a kernel.
func (d *Device) kernel(name string) (unsafe.Pointer, unsafe.Pointer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, err := d.contextLocked()
	if err != nil {
		return nil, nil, err
	}
	if d.moduleErr != nil {
		return nil, nil, fmt.Errorf("%s: %w", d.Name(), d.moduleErr)
	}
	if f, ok := d.funcs[name]; ok {
		return ctx, f, nil
	}
	f, err := d.drv.moduleFunc(ctx, d.module, name)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", d.Name(), err)
	}
	d.funcs[name] = f
	return ctx, f, nil
}

// Launch runs kernel name of the embedded module over n elements (a 1-D
// grid of up to maxBlocks blocks of blockSize threads; the kernels loop
// over the rest) with 8-byte parameter words, and waits for it. It does
// nothing when n is 0.
func (d *Device) Launch(name string, n uint64, params ...uint64) error {
	if n == 0 {
		return nil
	}
	blocks := min((n+blockSize-1)/blockSize, maxBlocks)
	return d.launch(name, uint32(blocks), params)
}

func (d *Device) launch(name string, blocks uint32, params []uint64) error {
	ctx, f, err := d.kernel(name)
	if err != nil {
		return err
	}
	if err := d.drv.launch(ctx, f, name, blocks, blockSize, params); err != nil {
		return fmt.Errorf("%s: %w", d.Name(), err)
	}
	return nil
}

func b64(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// Fill stores pattern (the element's bytes, little-endian) into count
// elements of elemSize bytes (1, 2, 4 or 8) at dst.
func (d *Device) Fill(dst uintptr, elemSize int, pattern uint64, count uint64) error {
	if count == 0 {
		return nil
	}
	switch elemSize {
	case 1, 2, 4:
		ctx, err := d.context()
		if err != nil {
			return err
		}
		return d.drv.memset(ctx, dst, elemSize, uint32(pattern), count)
	case 8:
		if uint32(pattern) == uint32(pattern>>32) {
			ctx, err := d.context()
			if err != nil {
				return err
			}
			return d.drv.memset(ctx, dst, 4, uint32(pattern), 2*count)
		}
		return d.Launch("memsh_fill64", count, count, uint64(dst), pattern)
	}
	return fmt.Errorf("cuda.Fill: element size %d", elemSize)
}

// Binary computes out[i] = a op b for i < n, all of dtype dt, in the
// arithmetic of memsh's CPU kernels (float32 for the 32- and 16-bit
// types, rounding to nearest even on store).
func (d *Device) Binary(op BinaryOp, dt DType, out uintptr, a, b Operand, n uint64) error {
	flags := b64(a.Number) | b64(b.Number)<<1
	return d.Launch("memsh_binary", n, uint64(op), uint64(dt), n, uint64(out),
		uint64(a.Ptr), max(a.Div, 1), a.Mod, uint64(b.Ptr), max(b.Div, 1), b.Mod,
		math.Float64bits(a.Value), math.Float64bits(b.Value), flags)
}

// Unary computes out[i] = op(in[i]) for i < n, both of dtype dt.
func (d *Device) Unary(op UnaryOp, dt DType, out, in uintptr, n uint64) error {
	return d.Launch("memsh_unary", n, uint64(op), uint64(dt), n, uint64(out), uint64(in))
}

// Cast converts n elements between float dtypes (dst[i] = src[i]).
func (d *Device) Cast(dstDT DType, dst uintptr, srcDT DType, src uintptr, n uint64) error {
	return d.Launch("memsh_cast", n, n, uint64(dstDT), uint64(dst), uint64(srcDT), uint64(src))
}

// Random fills n elements of dtype dt at out with the values of memsh's
// generator (Philox-4x32-10 keyed by seed) at offsets offset, offset+1,
// ...: uniform in [0, 1), or standard normal. They are the values the CPU
// gives for the same seed and offsets.
func (d *Device) Random(dt DType, out uintptr, n, seed, offset uint64, normal bool) error {
	return d.Launch("memsh_random", n, uint64(dt), n, uint64(out), seed, offset, b64(normal))
}

// Sum returns the sum of n elements of dtype dt at in, accumulated in
// float64: thread t of T adds elements t, t+T, t+2T, ... and the T partial
// sums are added on the host in order, so the result is deterministic.
func (d *Device) Sum(dt DType, in uintptr, n uint64) (float64, error) {
	if n == 0 {
		return 0, nil
	}
	if _, err := d.context(); err != nil {
		return 0, err
	}
	// The workspace is shared by the device's sums: one at a time.
	d.sumMu.Lock()
	defer d.sumMu.Unlock()
	d.mu.Lock()
	ws := d.partials
	d.mu.Unlock()
	if ws == 0 {
		return 0, fmt.Errorf("%s: no workspace for sums", d.Name())
	}
	threads := min((n+blockSize-1)/blockSize*blockSize, maxPartials)
	if err := d.launch("memsh_sum_partial", uint32(threads/blockSize), []uint64{uint64(dt), n, uint64(in), uint64(ws)}); err != nil {
		return 0, err
	}
	part := make([]float64, threads)
	if err := d.CopyDtoH(unsafe.Pointer(&part[0]), ws, threads*8); err != nil {
		return 0, err
	}
	s := 0.0
	for _, p := range part {
		s += p
	}
	return s, nil
}
