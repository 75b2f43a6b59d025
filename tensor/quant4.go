package tensor

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"unsafe"
	"weak"
)

// bitsandbytes' 4-bit weights (QLoRA's NF4 and FP4), as bitsandbytes
// 0.45–0.49 stores and dequantizes them on CUDA (bitsandbytes/functional.py
// quantize_4bit, dequantize_4bit, quantize_blockwise, dequantize_blockwise,
// get_4bit_type, create_dynamic_map; backends/cuda/ops.py for what each
// kernel allocates). A weight of n elements quantized in blocks of
// blocksize (64) is stored as
//
//   - the packed weight: uint8 [(n+1)/2, 1], two 4-bit codes per byte, the
//     first element of each pair in the high nibble;
//   - absmax: one scale per block, float32 [ceil(n/blocksize)] — or, with
//     compress_statistics (double quantization, nested), those scales less
//     their mean quantized again in blocks of 256 to uint8
//     [ceil(n/blocksize)] with the 8-bit dynamic map, which adds the nested
//     state's float32 scales [ceil(blocks/256)], a copy of the 256-entry
//     float32 dynamic map and the mean (offset, a 0-dim float32);
//   - code: the 4-bit type's 16 float32 values (get_4bit_type), one tensor
//     per quantized weight.
//
// Dequantizing (Dequantize4bit) makes the weight in the dtype it had when
// quantized; with nested statistics it first makes the float32 block
// scales (dequantize_blockwise, then + offset in place), freed once the
// weight exists.

// QuantState is bitsandbytes' QuantState of a 4-bit weight: the tensors
// (on the weight's device) and the figures its dequantization needs.
type QuantState struct {
	// Absmax is the block scales: float32 [blocks], or with nested
	// statistics uint8 [blocks] quantized by State2.
	Absmax *Tensor
	// Shape is the weight's shape ([out_features, in_features]).
	Shape []int
	// DType is the weight's dtype when it was quantized: what
	// dequantization makes.
	DType DType
	// Blocksize is the elements per scale (64).
	Blocksize int
	// Code is the 4-bit type's values, float32 [16] (for State2: its copy
	// of the dynamic map, float32 [256]).
	Code *Tensor
	// QuantType is "nf4" or "fp4" ("" for a nested state).
	QuantType string
	// Offset is the mean of the block scales, a 0-dim float32 tensor
	// (nested statistics only).
	Offset *Tensor
	// State2 is the nested state of double quantization: Absmax float32
	// [ceil(blocks/256)], Code a copy of the dynamic map (float32 [256]),
	// Blocksize 256; nil without compress_statistics.
	State2 *QuantState

	// dynamic is the device's shared dynamic map (bitsandbytes'
	// name2qmap["dynamic"]), which quantize_blockwise made at the first
	// nested quantization; held here so that it lives while a state uses
	// it (bitsandbytes keeps it for the process: 1 KiB).
	dynamic *Tensor
}

// Nested reports double quantization (compress_statistics).
func (q *QuantState) Nested() bool { return q.State2 != nil }

// Tensors returns the state's tensors (the reach walk's, and what its
// memory is): absmax, code, offset, the nested state's absmax and code,
// and the shared dynamic map.
func (q *QuantState) Tensors() []*Tensor {
	var out []*Tensor
	q.EachTensor(func(t *Tensor) { out = append(out, t) })
	return out
}

// EachTensor calls f for each tensor Tensors returns, in that order,
// without making the slice (the reach walk meets each 4-bit weight's
// state at every walk that walks its module).
func (q *QuantState) EachTensor(f func(*Tensor)) {
	for ; q != nil; q = q.State2 {
		for _, t := range [...]*Tensor{q.Absmax, q.Code, q.Offset, q.dynamic} {
			if t != nil {
				f(t)
			}
		}
	}
}

// Blocks returns the number of block scales of the weight.
func (q *QuantState) Blocks() int {
	return (numel(q.Shape) + q.Blocksize - 1) / q.Blocksize
}

// QuantStorageBytes is the bytes a 4-bit weight of n elements takes on a
// CUDA device as bitsandbytes stores it with blocksize 64 (each tensor
// rounded to the caching allocator's 512 bytes): the packed weight, the
// absmax and, nested, the uint8 absmax, the nested scales, the dynamic
// map's copy and the offset; plus the 16-value code. The shared dynamic
// map (1,024 bytes per device) is not included.
func QuantStorageBytes(n int, blocksize int, nested bool) int64 {
	r := func(b int) int64 {
		if b == 0 {
			return 0
		}
		return int64((b + 511) / 512 * 512)
	}
	blocks := (n + blocksize - 1) / blocksize
	total := r((n+1)/2) + r(16*4)
	if !nested {
		return total + r(4*blocks)
	}
	return total + r(blocks) + r(4*((blocks+255)/256)) + r(256*4) + r(4)
}

// The 4-bit types' values (get_4bit_type): NF4's sixteen quantiles of
// N(0, 1) normalised to [-1, 1] (QLoRA), FP4's values before division by
// their largest magnitude.
var (
	nf4Values = [16]float64{
		-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
		-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
		0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
		0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
	}
	fp4Values = [16]float64{0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0}
)

// code4 returns the 4-bit type's values as get_4bit_type leaves them
// (divided by their largest magnitude, in float32).
func code4(quantType string) ([16]float64, error) {
	var v [16]float64
	switch quantType {
	case "nf4":
		v = nf4Values
	case "fp4":
		v = fp4Values
	default:
		return v, fmt.Errorf("quant_type: want \"nf4\" or \"fp4\", got %q", quantType)
	}
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	for i := range v {
		v[i] = float64(float32(v[i]) / float32(m))
	}
	return v, nil
}

// dynamicMap is create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8): 256 sorted float32 values, the 8-bit dynamic type of
// quantize_blockwise.
var dynamicMap = sync.OnceValue(func() []float64 {
	var data []float64
	const maxExp, nonSign = 7, 7
	for i := 0; i < maxExp; i++ {
		items := 1<<(i+nonSign-maxExp) + 1
		bounds := linspace32(0.1, 1, items)
		scale := float32(math.Pow(10, float64(-(maxExp-1)+i)))
		for j := 0; j+1 < len(bounds); j++ {
			mean := (bounds[j] + bounds[j+1]) / 2
			data = append(data, float64(scale*mean))
		}
		for j := 0; j+1 < len(bounds); j++ {
			mean := (bounds[j] + bounds[j+1]) / 2
			data = append(data, float64(-scale*mean))
		}
	}
	data = append(data, 0, 1)
	for len(data) < 256 {
		data = append(data, 0)
	}
	sort.Float64s(data)
	return data
})

// linspace32 is torch.linspace(start, end, steps, dtype=float32).
func linspace32(start, end float32, steps int) []float32 {
	out := make([]float32, steps)
	if steps == 1 {
		out[0] = start
		return out
	}
	step := (end - start) / float32(steps-1)
	half := steps / 2
	for i := range out {
		if i < half {
			out[i] = start + step*float32(i)
		} else {
			out[i] = end - step*float32(steps-i-1)
		}
	}
	return out
}

// nearest returns the index of the value of sorted-or-not vals closest
// to x (the first on a tie).
func nearest(vals []float64, x float64) int {
	best, bd := 0, math.Inf(1)
	for i, v := range vals {
		if d := math.Abs(v - x); d < bd {
			best, bd = i, d
		}
	}
	return best
}

// nearestSorted is nearest over ascending values (binary search).
func nearestSorted(vals []float64, x float64) int {
	i := sort.SearchFloat64s(vals, x)
	switch {
	case i == 0:
		return 0
	case i == len(vals):
		return len(vals) - 1
	case x-vals[i-1] <= vals[i]-x:
		return i - 1
	}
	return i
}

// quantShared is what a Context's 4-bit quantization shares: each
// device's dynamic map while a state holds it.
type quantShared struct {
	mu      sync.Mutex
	dynamic map[string]weak.Pointer[Tensor]
}

// dynamicOn returns the device's dynamic map (name2qmap["dynamic"],
// create_dynamic_map().to(device): float32 [256]), making it when no
// quantization state holds it.
func (c *Context) dynamicOn(device string) (*Tensor, error) {
	if c.quant == nil {
		c.quant = &quantShared{}
	}
	q := c.quant
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.dynamic[device].Value(); t != nil && !t.mem.Released() {
		return t, nil
	}
	t, err := fromValues(c, "bitsandbytes.create_dynamic_map", dynamicMap(), []int{256}, Float32, device)
	if err != nil {
		return nil, err
	}
	if q.dynamic == nil {
		q.dynamic = map[string]weak.Pointer[Tensor]{}
	}
	q.dynamic[device] = weak.Make(t)
	return t, nil
}

// fromValues makes a contiguous tensor of vals on device.
func fromValues(c *Context, fname string, vals []float64, shape []int, dt DType, device string) (*Tensor, error) {
	t, err := newTensor(c, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if err := store(fname, t, vals); err != nil {
		return nil, err
	}
	return t, nil
}

// store writes vals (row-major) into the new contiguous t, unless t is on
// a meta device (vals may then be nil).
func store(fname string, t *Tensor, vals []float64) error {
	if t.isMeta() || vals == nil {
		return nil
	}
	dt := t.dtype
	size := dt.Size()
	return storeValues(fname, t, func(p unsafe.Pointer) {
		st := storeF64[dt]
		for i, v := range vals {
			st(elemAddr(p, i, size), v)
		}
	})
}

// hostValues reads t's values for a host computation; nil on a meta
// device (the computation then only allocates).
func hostValues(t *Tensor) ([]float64, error) {
	if t.isMeta() || t.Numel() == 0 {
		return nil, nil
	}
	return t.ToFloat64s()
}

// Quantize4bit is bitsandbytes.functional.quantize_4bit(a, blocksize,
// compress_statistics, quant_type, quant_storage=torch.uint8) on a's
// device: it returns the packed weight, uint8 [(n+1)/2, 1], and its
// QuantState. Allocations, in bitsandbytes' order: the float32 absmax
// [blocks] and the packed weight (the quantize_4bit kernel), the code's
// 16 values (get_4bit_type: the tensor, then its abs() and max() freed at
// once); nested: the offset (absmax.mean()), absmax − offset (float32
// [blocks], freed when quantize_blockwise returns), the device's dynamic
// map if none is alive, the nested scales (float32 [ceil(blocks/256)])
// and the uint8 absmax, the dynamic map's copy; then the float32 absmax
// is freed. blocksize is 64 for QLoRA (32 … 4096 allowed).
func Quantize4bit(a *Tensor, blocksize int, compress bool, quantType string) (*Tensor, *QuantState, error) {
	const fname = "bitsandbytes.quantize_4bit"
	code, err := code4(quantType)
	if err != nil {
		return nil, nil, errorf(fname, "%w", err)
	}
	switch blocksize {
	case 32, 64, 128, 256, 512, 1024, 2048, 4096:
	default:
		return nil, nil, errorf(fname, "blocksize: want one of 32, 64, 128, 256, 512, 1024, 2048, 4096, got %d", blocksize)
	}
	switch a.dtype {
	case Float32, Float16, BFloat16:
	default:
		return nil, nil, errorf(fname, "Blockwise 4bit quantization only supports 16/32-bit floats, but got %s", a.dtype)
	}
	c, dev := a.ctx, a.Device()
	n := a.Numel()
	blocks := (n + blocksize - 1) / blocksize
	vals, err := hostValues(a)
	if err != nil {
		return nil, nil, err
	}
	// the kernel: block scales, then the packed codes
	var absVals []float64
	var packedVals []float64
	if vals != nil {
		absVals = make([]float64, blocks)
		packedVals = make([]float64, (n+1)/2)
		for b := range blocks {
			m := 0.0
			for _, v := range vals[b*blocksize : min(n, (b+1)*blocksize)] {
				m = math.Max(m, math.Abs(v))
			}
			absVals[b] = float64(float32(m))
		}
		for i := 0; i < n; i++ {
			s := absVals[i/blocksize]
			x := 0.0
			if s != 0 {
				x = vals[i] / s
			}
			q := nearest(code[:], x)
			if i%2 == 0 {
				packedVals[i/2] += float64(q << 4)
			} else {
				packedVals[i/2] += float64(q)
			}
		}
	}
	absmax, err := fromValues(c, fname, absVals, []int{blocks}, Float32, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(absmax)()
	packed, err := fromValues(c, fname, packedVals, []int{(n + 1) / 2, 1}, Uint8, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(packed)()
	codeT, err := get4bitType(c, code, dev, vals != nil)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(codeT)()
	qs := &QuantState{Absmax: absmax, Shape: slices.Clone(a.shape), DType: a.dtype, Blocksize: blocksize, Code: codeT, QuantType: quantType}
	if !compress {
		return packed, qs, nil
	}
	// offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256)
	var offVals, centred []float64
	if absVals != nil {
		sum := 0.0
		for _, v := range absVals {
			sum += v
		}
		off := float64(float32(sum / float64(blocks)))
		offVals = []float64{off}
		centred = make([]float64, blocks)
		for i, v := range absVals {
			centred[i] = float64(float32(v - off))
		}
	}
	offset, err := fromValues(c, fname, offVals, []int{}, Float32, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(offset)()
	tmp, err := fromValues(c, fname, centred, []int{blocks}, Float32, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(tmp)()
	state2, qabsmax, err := quantizeBlockwise(c, fname, centred, blocks, dev)
	if err != nil {
		return nil, nil, err
	}
	Dropped(tmp, absmax)
	qs.Absmax, qs.Offset, qs.State2, qs.dynamic = qabsmax, offset, state2, state2.dynamic
	state2.dynamic = nil
	return packed, qs, nil
}

// get4bitType is get_4bit_type(quant_type, device): the values' tensor,
// with data.abs().max() made and freed while it is divided in place.
func get4bitType(c *Context, code [16]float64, dev string, data bool) (*Tensor, error) {
	const fname = "bitsandbytes.get_4bit_type"
	var vals []float64
	if data {
		vals = code[:]
	}
	t, err := fromValues(c, fname, vals, []int{16}, Float32, dev)
	if err != nil {
		return nil, err
	}
	defer c.Hold(t)()
	abs, err := newTensor(c, fname, dev, Float32, []int{16})
	if err != nil {
		return nil, err
	}
	defer c.Hold(abs)()
	mx, err := newTensor(c, fname, dev, Float32, []int{})
	if err != nil {
		return nil, err
	}
	Dropped(abs, mx)
	return t, nil
}

// quantizeBlockwise is quantize_blockwise(A, blocksize=256) of the
// float32 [blocks] values vals (nil on a meta device) with the dynamic
// map: the nested state (its scales and the map's copy) and the uint8
// codes.
func quantizeBlockwise(c *Context, fname string, vals []float64, n int, dev string) (*QuantState, *Tensor, error) {
	const bs = 256
	dyn, err := c.dynamicOn(dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(dyn)()
	blocks := (n + bs - 1) / bs
	var absVals, qVals []float64
	if vals != nil {
		code := dynamicMap()
		absVals = make([]float64, blocks)
		qVals = make([]float64, n)
		for b := range blocks {
			m := 0.0
			for _, v := range vals[b*bs : min(n, (b+1)*bs)] {
				m = math.Max(m, math.Abs(v))
			}
			absVals[b] = float64(float32(m))
		}
		for i, v := range vals {
			x := 0.0
			if s := absVals[i/bs]; s != 0 {
				x = v / s
			}
			qVals[i] = float64(nearestSorted(code, x))
		}
	}
	absmax, err := fromValues(c, fname, absVals, []int{blocks}, Float32, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(absmax)()
	out, err := fromValues(c, fname, qVals, []int{n}, Uint8, dev)
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(out)()
	var codeVals []float64
	if vals != nil {
		codeVals = dynamicMap()
	}
	codeCopy, err := fromValues(c, fname, codeVals, []int{256}, Float32, dev)
	if err != nil {
		return nil, nil, err
	}
	return &QuantState{Absmax: absmax, Shape: []int{n}, DType: Float32, Blocksize: bs, Code: codeCopy, dynamic: dyn}, out, nil
}

// scaleValues computes q's float32 block scales on the host (nil on a
// meta device): the absmax itself, or for a nested state the dequantized
// uint8 codes plus the offset.
func scaleValues(q *QuantState) ([]float64, error) {
	if !q.Nested() {
		return hostValues(q.Absmax)
	}
	codes, err := hostValues(q.Absmax)
	if err != nil || codes == nil {
		return nil, err
	}
	s2, err := hostValues(q.State2.Absmax)
	if err != nil {
		return nil, err
	}
	code, err := hostValues(q.State2.Code)
	if err != nil {
		return nil, err
	}
	off, err := hostValues(q.Offset)
	if err != nil {
		return nil, err
	}
	vals := make([]float64, len(codes))
	for i, k := range codes {
		vals[i] = float64(float32(code[int(k)]*s2[i/q.State2.Blocksize]) + float32(off[0]))
	}
	return vals, nil
}

// dequantHost computes the weight's values on the host (row-major
// q.Shape; nil on a meta device).
func dequantHost(packed *Tensor, q *QuantState) ([]float64, error) {
	svals, err := scaleValues(q)
	if err != nil || svals == nil {
		return nil, err
	}
	bytes, err := hostValues(packed)
	if err != nil {
		return nil, err
	}
	code, err := hostValues(q.Code)
	if err != nil {
		return nil, err
	}
	vals := make([]float64, numel(q.Shape))
	for i := range vals {
		b := int(bytes[i/2])
		k := b >> 4
		if i%2 == 1 {
			k = b & 15
		}
		vals[i] = float64(float32(code[k]) * float32(svals[i/q.Blocksize]))
	}
	return vals, nil
}

// blockScales makes what a nested state's dequantization makes before
// the weight: dequantize_blockwise(absmax, state2) (float32 [blocks]),
// then + offset — in place for dequantize_4bit (plusInPlace), a second
// tensor for gemv_4bit's "+ state.offset", made before the first is
// freed. It returns the tensors still to be freed once the caller's
// output exists; none without nested statistics.
func blockScales(q *QuantState, plusInPlace bool) ([]*Tensor, error) {
	const fname = "bitsandbytes.dequantize_blockwise"
	if !q.Nested() {
		return nil, nil
	}
	c, dev := q.Absmax.ctx, q.Absmax.Device()
	t, err := newTensor(c, fname, dev, Float32, []int{q.Blocks()})
	if err != nil {
		return nil, err
	}
	if plusInPlace {
		return []*Tensor{t}, nil
	}
	defer c.Hold(t)()
	sum, err := newTensor(c, fname, dev, Float32, []int{q.Blocks()})
	if err != nil {
		return nil, err
	}
	Dropped(t)
	return []*Tensor{sum}, nil
}

// checkPacked checks a packed weight against its state.
func checkPacked(fname string, packed *Tensor, q *QuantState) error {
	if packed.dtype != Uint8 {
		return errorf(fname, "the packed weight must be uint8, got %s", packed.dtype)
	}
	if n := numel(q.Shape); packed.Numel() != (n+1)/2 {
		return errorf(fname, "the packed weight has %d bytes, the state's shape %s needs %d", packed.Numel(), fmtShape(q.Shape), (n+1)/2)
	}
	return nil
}

// Dequantize4bit is bitsandbytes.functional.dequantize_4bit(packed, q):
// the weight, contiguous q.Shape in q.DType on packed's device. With
// nested statistics the float32 block scales are made first and freed
// once the weight exists.
func Dequantize4bit(packed *Tensor, q *QuantState) (*Tensor, error) {
	const fname = "bitsandbytes.dequantize_4bit"
	if err := checkPacked(fname, packed, q); err != nil {
		return nil, err
	}
	c := packed.ctx
	made, err := blockScales(q, true)
	if err != nil {
		return nil, err
	}
	defer c.Hold(made...)()
	vals, err := dequantHost(packed, q)
	if err != nil {
		return nil, err
	}
	out, err := fromValues(c, fname, vals, q.Shape, q.DType, packed.Device())
	if err != nil {
		return nil, err
	}
	Dropped(made...)
	return out, nil
}

// Gemv4bit is bitsandbytes' gemv_4bit(A, B.t(), state) — matmul_4bit's
// inference path for one row that needs no gradient: the output
// [..., out_features] in A's dtype, after the nested block scales
// (two float32 [blocks] tensors, freed once the output exists); no
// dequantized weight is made.
func Gemv4bit(a, packed *Tensor, q *QuantState) (*Tensor, error) {
	const fname = "bitsandbytes.gemv_4bit"
	if err := checkPacked(fname, packed, q); err != nil {
		return nil, err
	}
	k := q.Shape[1]
	if a.Dim() == 0 || a.shape[a.Dim()-1] != k || a.Numel() != k {
		return nil, errorf(fname, "A must be one row of %d values, got %s", k, fmtShape(a.shape))
	}
	c := a.ctx
	made, err := blockScales(q, false)
	if err != nil {
		return nil, err
	}
	defer c.Hold(made...)()
	var vals []float64
	if !a.isMeta() {
		w, err := dequantHost(packed, q)
		if err != nil {
			return nil, err
		}
		x, err := hostValues(a)
		if err != nil {
			return nil, err
		}
		vals = make([]float64, q.Shape[0])
		for j := range vals {
			s := 0.0
			for i, xv := range x {
				s += xv * w[j*k+i]
			}
			vals[j] = s
		}
	}
	shape := append(slices.Clone(a.shape[:a.Dim()-1]), q.Shape[0])
	out, err := fromValues(c, fname, vals, shape, a.dtype, a.Device())
	if err != nil {
		return nil, err
	}
	Dropped(made...)
	return out, nil
}
