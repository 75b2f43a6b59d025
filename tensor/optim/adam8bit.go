package optim

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Adam8bit is bitsandbytes' 8-bit Adam family (bnb.optim.Adam8bit,
// AdamW8bit, PagedAdam8bit, PagedAdamW8bit: Optimizer2State with
// optim_bits=8, "adam"), as bitsandbytes 0.46 and later keep it
// (bitsandbytes/optim/optimizer.py; before 0.46 the block was 2048
// elements, not 256).
//
// State, made at a parameter's first step (Optimizer2State.init_state),
// in this order:
//
//   - a parameter of at least min_8bit_size elements (4096 by default):
//     on the optimizer's first such parameter, the two dynamic
//     quantization maps, "qmap1" (signed) and "qmap2" (unsigned), float32
//     [256], made on the host at construction and copied to the device
//     (1,024 bytes each, shared by every parameter's state: one pair per
//     optimizer); then "state1" and "state2", uint8 of the parameter's
//     shape; then "absmax1" and "absmax2", float32 [ceil(numel / 256)];
//   - a smaller parameter: "state1" and "state2", float32 of its shape
//     (32-bit states, as bitsandbytes keeps them);
//   - "step", a number (host).
//
// The paged variants (PagedAdamW8bit) take state1 and state2 of a
// parameter of at least 100,000 elements from bitsandbytes' paged memory
// (cudaMallocManaged, wrapped as a CPU tensor with is_paged=True;
// get_state_buffer): outside PyTorch's caching allocator, so not in
// memory_allocated() or the reserved bytes. memsh counts them where they
// live: as paged (managed) memory, reported by PagedBytes (the Starlark
// optimizer's paged_bytes()) and in the state as a PagedBuffer, not on
// the simulated device. On a real GPU the driver migrates these pages to
// the device while the step prefetches them and evicts them to the host
// when device allocations need the room, so they never cause an
// out-of-memory error (only slower steps); the absmax and qmap tensors and
// the states of smaller parameters stay ordinary device tensors.
//
// A step allocates nothing: each parameter's update is one fused CUDA
// kernel (optimizer_update_8bit_blockwise or, for 32-bit states,
// optimizer_update_32bit) that reads the gradient and rewrites the
// parameter, the states and absmax in place. (update_step first makes the
// gradient contiguous, p.grad = p.grad.contiguous(): a copy only for a
// non-contiguous gradient.) bitsandbytes has no CPU implementation of
// these kernels, so no PyTorch recording exists: memsh's figures follow
// the code above, checked by closed forms (testdata/optim.star).
//
// Values: on a device with data the update is AdamW's (decoupled weight
// decay, as bitsandbytes' "adam" kernels apply it), with the moments
// stored block-wise: each block of 256 is dequantized from its codes and
// absmax, updated, and quantized again to the nearest entry of the
// dynamic map scaled by the block's new absmax. The dynamic maps follow
// the construction of bitsandbytes' create_dynamic_map (7 exponent bits,
// a linear fraction between 0.1 and 1). The arithmetic runs on host
// copies of the values; bitsandbytes' kernels differ in rounding details.
type Adam8bit struct {
	params                        []*tensor.Tensor
	LR, Beta1, Beta2, Eps, WDecay float64
	MinSize                       int  // min_8bit_size
	Paged, Decoupled              bool // PagedAdam(W)8bit; AdamW8bit (the name: both apply decoupled decay)
	hostQ1, hostQ2                *tensor.Tensor
	q1, q2                        *tensor.Tensor // the maps on the device, once copied
	state                         map[*tensor.Tensor]*adam8bitState
	byIndex                       []*adam8bitState
	marked
}

type adam8bitState struct {
	step                                     float64
	state1, state2, absmax1, absmax2, q1, q2 *tensor.Tensor
	paged1, paged2                           *PagedBuffer
}

// PagedBuffer is a state buffer in bitsandbytes' paged (managed) memory
// (F.get_paged): a CPU tensor to PyTorch, with is_paged set; not device
// memory to the caching allocator. data holds its bytes on a device with
// data (nil on a meta device).
type PagedBuffer struct {
	Shape    []int
	DType    tensor.DType
	DeviceID int // page_deviceid: the GPU its pages are prefetched to
	data     []float64
}

// Bytes is the buffer's size.
func (b *PagedBuffer) Bytes() uint64 {
	n := uint64(b.DType.Size())
	for _, s := range b.Shape {
		n *= uint64(s)
	}
	return n
}

// Block8bit is the block size of bitsandbytes' block-wise 8-bit states
// (0.46+).
const Block8bit = 256

// PagedMinNumel is the size from which a paged optimizer's state buffers
// are paged (get_state_buffer: p.numel() >= 1e5).
const PagedMinNumel = 100_000

// Default8bitMinSize is min_8bit_size's default: parameters of fewer
// elements keep 32-bit states.
const Default8bitMinSize = 4096

// NewAdam8bit checks the options as bitsandbytes does.
func NewAdam8bit(params []*tensor.Tensor, lr, beta1, beta2, eps, weightDecay float64, amsgrad bool, optimBits, minSize int, paged, decoupled bool) (*Adam8bit, error) {
	o := &Adam8bit{params: params, LR: lr, Beta1: beta1, Beta2: beta2, Eps: eps, WDecay: weightDecay, MinSize: minSize,
		Paged: paged, Decoupled: decoupled, state: map[*tensor.Tensor]*adam8bitState{}}
	name := o.Name()
	if amsgrad {
		return nil, fmt.Errorf("%s does not support amsgrad=True", name[len("bnb."):])
	}
	if optimBits != 32 {
		return nil, fmt.Errorf("%s only supports optim_bits=32 (default value for compatibility)", name[len("bnb."):])
	}
	switch {
	case !(lr >= 0):
		return nil, fmt.Errorf("%s: Invalid learning rate: %v", name, lr)
	case !(eps >= 0):
		return nil, fmt.Errorf("%s: Invalid epsilon value: %v", name, eps)
	case !(beta1 >= 0 && beta1 < 1):
		return nil, fmt.Errorf("%s: Invalid beta parameter at index 0: %v", name, beta1)
	case !(beta2 >= 0 && beta2 < 1):
		return nil, fmt.Errorf("%s: Invalid beta parameter at index 1: %v", name, beta2)
	case !(weightDecay >= 0):
		return nil, fmt.Errorf("%s: Invalid weight_decay value: %v", name, weightDecay)
	}
	if err := checkParams(name, params); err != nil {
		return nil, err
	}
	// fill_qmap: the two maps, made on the host at construction
	var err error
	ctx := params[0].Context()
	if o.hostQ1, err = tensor.FromFloat64s(ctx, DynamicMap(true), []int{256}, tensor.Float32, "cpu"); err != nil {
		return nil, err
	}
	// o is not a value yet: the first map is held while the second is made
	defer ctx.Hold(o.hostQ1)()
	if o.hostQ2, err = tensor.FromFloat64s(ctx, DynamicMap(false), []int{256}, tensor.Float32, "cpu"); err != nil {
		return nil, err
	}
	return o, nil
}

// Name is bitsandbytes' class name, with bnb. in front.
func (o *Adam8bit) Name() string {
	n := "Adam8bit"
	if o.Decoupled {
		n = "AdamW8bit"
	}
	if o.Paged {
		n = "Paged" + n
	}
	return "bnb." + n
}

func (o *Adam8bit) Params() []*tensor.Tensor { return o.params }

// State: "step", "state1", "state2" and, for 8-bit states, "qmap1",
// "qmap2", "absmax1", "absmax2"; a paged state is a *PagedBuffer.
func (o *Adam8bit) State(p *tensor.Tensor) map[string]any {
	s := o.state[p]
	if s == nil {
		return nil
	}
	m := map[string]any{"step": s.step}
	for k, t := range map[string]*tensor.Tensor{"state1": s.state1, "state2": s.state2, "qmap1": s.q1, "qmap2": s.q2,
		"absmax1": s.absmax1, "absmax2": s.absmax2} {
		if t != nil {
			m[k] = t
		}
	}
	if s.paged1 != nil {
		m["state1"], m["state2"] = s.paged1, s.paged2
	}
	return m
}

// StateTensors implements Optimizer: paged states are no tensors of the
// device (State gives the *PagedBuffer).
func (o *Adam8bit) StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor)) {
	s := o.state[p]
	if s == nil {
		return
	}
	if s.paged1 == nil {
		each(fn, s.state1, s.state2)
	}
	each(fn, s.q1, s.q2, s.absmax1, s.absmax2)
}

// PagedBytes is the paged (managed) memory the states hold.
func (o *Adam8bit) PagedBytes() uint64 {
	var n uint64
	for _, s := range o.state {
		if s.paged1 != nil {
			n += s.paged1.Bytes() + s.paged2.Bytes()
		}
	}
	return n
}

// Reach passes the parameters, the maps and the state tensors to r.
func (o *Adam8bit) Reach(r *tensor.Reacher) {
	if !o.visit(r) {
		return
	}
	for _, p := range o.params {
		r.Tensor(p)
	}
	r.Tensor(o.hostQ1)
	r.Tensor(o.hostQ2)
	r.Tensor(o.q1)
	r.Tensor(o.q2)
	for _, s := range o.byIndex {
		if s == nil {
			continue
		}
		for _, t := range []*tensor.Tensor{s.state1, s.state2, s.absmax1, s.absmax2, s.q1, s.q2} {
			r.Tensor(t)
		}
	}
}

// Adam8bitStateBytes is the device state bitsandbytes' 8-bit Adam gives a
// parameter of numel elements (each tensor rounded by round; the shared
// qmaps not included) and its paged bytes: 2 × numel uint8 + 2 ×
// ceil(numel/256) float32 absmax at or above minSize elements, else 2 ×
// numel float32; with paged, state1 and state2 of a parameter of at least
// 100,000 elements are paged instead.
func Adam8bitStateBytes(numel uint64, minSize int, paged bool, round func(uint64) uint64) (device, pagedBytes uint64) {
	elem := uint64(4)
	eightBit := numel >= uint64(minSize)
	if eightBit {
		elem = 1
		blocks := (numel + Block8bit - 1) / Block8bit
		device += 2 * round(4*blocks)
	}
	if paged && numel >= PagedMinNumel {
		return device, 2 * elem * numel
	}
	return device + 2*round(elem*numel), 0
}

// stateBuffer is get_state_buffer: zeros like p of dtype dt, or a paged
// buffer for a paged optimizer and a parameter of 1e5 elements or more
// on a GPU.
func (o *Adam8bit) stateBuffer(p *tensor.Tensor, dt tensor.DType) (*tensor.Tensor, *PagedBuffer, error) {
	if !o.Paged || p.Numel() < PagedMinNumel || !isCUDA(p.Device()) {
		t, err := tensor.ZerosLike(p, dt, p.Device())
		return t, nil, err
	}
	b := &PagedBuffer{Shape: p.Shape(), DType: dt, DeviceID: deviceOrdinal(p.Device())}
	if p.NeedData("paged") == nil {
		b.data = make([]float64, p.Numel()) // F.fill(buff, 0)
	}
	return nil, b, nil
}

func deviceOrdinal(dev string) int {
	var n int
	if _, err := fmt.Sscanf(dev, "cuda:%d", &n); err != nil {
		return 0
	}
	return n
}

// initState is Optimizer2State.init_state for p. Each state tensor is
// noted as soon as it is made (marked.grew): the walk of the next one's
// allocation keeps the frame that holds the optimizer.
func (o *Adam8bit) initState(i int, p *tensor.Tensor) (*adam8bitState, error) {
	s := &adam8bitState{}
	o.state[p] = s
	if o.byIndex == nil {
		o.byIndex = make([]*adam8bitState, len(o.params))
	}
	o.byIndex[i] = s
	ctx := p.Context()
	buffer := func(t **tensor.Tensor, b **PagedBuffer, dt tensor.DType) (err error) {
		if *t, *b, err = o.stateBuffer(p, dt); err == nil {
			o.grew(ctx, *t)
		}
		return err
	}
	if p.Numel() < o.MinSize {
		if err := buffer(&s.state1, &s.paged1, tensor.Float32); err != nil {
			return nil, err
		}
		return s, buffer(&s.state2, &s.paged2, tensor.Float32)
	}
	// self.name2qmap[...] = self.name2qmap[...].to(p.device)
	for k, q := range []**tensor.Tensor{&o.q1, &o.q2} {
		if *q == nil || (*q).Device() != p.Device() {
			src := []*tensor.Tensor{o.hostQ1, o.hostQ2}[k]
			moved, err := tensor.To(src, p.Device(), tensor.Undefined, false)
			if err != nil {
				return nil, err
			}
			replaced := *q != nil // the map on another device: let go here
			*q = moved
			if replaced {
				o.changed(ctx)
			} else {
				o.grew(ctx, moved)
			}
		}
	}
	if err := buffer(&s.state1, &s.paged1, tensor.Uint8); err != nil {
		return nil, err
	}
	s.q1 = o.q1
	if err := buffer(&s.state2, &s.paged2, tensor.Uint8); err != nil {
		return nil, err
	}
	s.q2 = o.q2
	blocks := (p.Numel() + Block8bit - 1) / Block8bit
	var err error
	if s.absmax1, err = tensor.Zeros(ctx, []int{blocks}, tensor.Float32, p.Device()); err != nil {
		return nil, err
	}
	o.grew(ctx, s.absmax1)
	if s.absmax2, err = tensor.Zeros(ctx, []int{blocks}, tensor.Float32, p.Device()); err != nil {
		return nil, err
	}
	o.grew(ctx, s.absmax2)
	return s, nil
}

// Step updates every parameter with a gradient, parameter by parameter
// (Optimizer8bit.step: init_state, then update_step).
func (o *Adam8bit) Step() error {
	return noGrad(o.params, func() error {
		for i, p := range o.params {
			g := autograd.Grad(p)
			if g == nil {
				continue
			}
			s := o.state[p]
			if s == nil {
				var err error
				if s, err = o.initState(i, p); err != nil {
					return err
				}
			}
			// p.grad = p.grad.contiguous()
			if !g.IsContiguous() {
				c, err := tensor.Contiguous(g)
				if err != nil {
					return err
				}
				if err := autograd.SetGrad(p, c); err != nil {
					return err
				}
				p.ReachChanged()
				g = c
			}
			s.step++
			if p.NeedData("step") != nil {
				continue // meta: the kernel's allocations (none) only
			}
			if err := o.update(p, g, s); err != nil {
				return err
			}
		}
		return nil
	})
}

// update is the fused kernel's arithmetic, on host copies of the values.
func (o *Adam8bit) update(p, g *tensor.Tensor, s *adam8bitState) error {
	pv, err := p.ToFloat64s()
	if err != nil {
		return err
	}
	gv, err := g.ToFloat64s()
	if err != nil {
		return err
	}
	read := func(t *tensor.Tensor, b *PagedBuffer) ([]float64, error) {
		if b != nil {
			return b.data, nil
		}
		return t.ToFloat64s()
	}
	write := func(t *tensor.Tensor, b *PagedBuffer, v []float64) error {
		if b != nil {
			b.data = v
			return nil
		}
		return t.SetFloat64s(v)
	}
	m, err := read(s.state1, s.paged1)
	if err != nil {
		return err
	}
	v, err := read(s.state2, s.paged2)
	if err != nil {
		return err
	}
	eightBit := s.absmax1 != nil
	var a1, a2, q1, q2 []float64
	if eightBit {
		if a1, err = s.absmax1.ToFloat64s(); err != nil {
			return err
		}
		if a2, err = s.absmax2.ToFloat64s(); err != nil {
			return err
		}
		if q1, err = s.q1.ToFloat64s(); err != nil {
			return err
		}
		if q2, err = s.q2.ToFloat64s(); err != nil {
			return err
		}
	}
	b1, b2 := o.Beta1, o.Beta2
	bc1 := 1 - math.Pow(b1, s.step)
	bc2 := math.Sqrt(1 - math.Pow(b2, s.step))
	for lo := 0; lo < len(pv); lo += Block8bit {
		hi := min(lo+Block8bit, len(pv))
		blk := lo / Block8bit
		mx1, mx2 := 0.0, 0.0
		for i := lo; i < hi; i++ {
			mi, vi := m[i], v[i]
			if eightBit {
				mi, vi = q1[int(mi)]*a1[blk], q2[int(vi)]*a2[blk]
			}
			mi = b1*mi + (1-b1)*gv[i]
			vi = b2*vi + (1-b2)*gv[i]*gv[i]
			pv[i] *= 1 - o.LR*o.WDecay
			pv[i] -= o.LR / bc1 * mi / (math.Sqrt(vi)/bc2 + o.Eps)
			m[i], v[i] = mi, vi
			mx1, mx2 = math.Max(mx1, math.Abs(mi)), math.Max(mx2, math.Abs(vi))
		}
		if eightBit {
			a1[blk], a2[blk] = mx1, mx2
			for i := lo; i < hi; i++ {
				m[i] = float64(nearest(q1, safeDiv(m[i], mx1)))
				v[i] = float64(nearest(q2, safeDiv(v[i], mx2)))
			}
		}
	}
	if eightBit {
		if err := s.absmax1.SetFloat64s(a1); err != nil {
			return err
		}
		if err := s.absmax2.SetFloat64s(a2); err != nil {
			return err
		}
	}
	if err := write(s.state1, s.paged1, m); err != nil {
		return err
	}
	if err := write(s.state2, s.paged2, v); err != nil {
		return err
	}
	return p.SetFloat64s(pv)
}

func safeDiv(x, y float64) float64 {
	if y == 0 {
		return 0
	}
	return x / y
}

// nearest returns the index of the entry of the sorted map q nearest to x.
func nearest(q []float64, x float64) int {
	i := sort.SearchFloat64s(q, x)
	switch {
	case i == 0:
		return 0
	case i == len(q):
		return len(q) - 1
	case x-q[i-1] <= q[i]-x:
		return i - 1
	}
	return i
}

// DynamicMap is the 256-entry dynamic quantization map of bitsandbytes'
// create_dynamic_map(signed) (7 exponent bits, 8 bits in all), sorted:
// for each exponent e = 0..6, the midpoints of a linear grid of 2^e + 1
// (signed) or 2^(e+1) + 1 (unsigned) points between 0.1 and 1, scaled by
// 10^(e-6) (and negated too when signed), then 0 and 1.
func DynamicMap(signed bool) []float64 {
	var data []float64
	for e := 0; e < 7; e++ {
		n := 1 << e
		if !signed {
			n = 1 << (e + 1)
		}
		scale := math.Pow(10, float64(e-6))
		for k := 0; k < n; k++ {
			lo := 0.1 + 0.9*float64(k)/float64(n)
			hi := 0.1 + 0.9*float64(k+1)/float64(n)
			mid := float64(float32((lo + hi) / 2))
			data = append(data, scale*mid)
			if signed {
				data = append(data, -scale*mid)
			}
		}
	}
	data = append(data, 0, 1)
	for len(data) < 256 {
		data = append(data, 0)
	}
	slices.Sort(data)
	return data
}
