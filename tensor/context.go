package tensor

import (
	"errors"
	"sync/atomic"

	"github.com/memsh/memsh/backend"
)

// A Context is what the engine needs from a Session: the Manager that owns
// every tensor's memory, the random generator's state and the default
// device. Tensors keep a pointer to the Context they were made in; every
// op's results share it. A Context is not safe for concurrent use (a
// Session runs one thread).
type Context struct {
	// Manager owns the memory of every tensor made in this Context.
	Manager *backend.Manager
	// DefaultDevice is the device creation functions use when given ""
	// ("cpu" when empty).
	DefaultDevice string

	// GradDisabled turns autograd's graph recording off (torch.no_grad);
	// package tensor/autograd reads and sets it.
	GradDisabled bool

	// SDPDisabled is the set of scaled_dot_product_attention backends
	// turned off (torch.nn.attention.sdpa_kernel, torch.backends.cuda.
	// enable_{flash,mem_efficient,math}_sdp(False)); the zero value
	// enables them all. See SelectSDPBackend.
	SDPDisabled SDPBackends

	// Autocast is the torch.autocast("cuda") state (nil until autocast is
	// first used; see AutocastState), shared with staging contexts.
	Autocast *AutocastState

	// MetaInit, while positive, makes new tensors on the meta device
	// (MetaDevice): their memory is deferred (backend
	// Manager.AllocDeferred) until Materialize.
	MetaInit int

	rng *rngState // shared with staging contexts

	// inFlight holds tensors that Go code is computing with and that no
	// Starlark value may reach (autocast's casts of an op's arguments, a
	// layer's first parameter while it makes the second), so that the
	// reclaim proof (reach.go) sees them.
	inFlight []*Tensor
	// inFlightMem is inFlight for raw allocations (a kernel's temporary,
	// reduce_scratch.go).
	inFlightMem []*backend.Memory

	// roots are Go code's roots of the reach walk and the tick count
	// (reach.go), shared with staging contexts.
	roots *goRoots

	// intr is the interrupt flag (Ctrl-C), shared with staging contexts;
	// see Interrupt.
	intr *atomic.Bool

	// blas holds the cuBLAS workspaces PyTorch would have allocated
	// (blas_workspace.go), shared with staging contexts.
	blas *blasState

	// quant is what 4-bit quantization shares (quant4.go: each device's
	// dynamic map), shared with staging contexts.
	quant *quantShared
}

// rngState is the Philox generator's state: the key and the counter of
// the next value.
type rngState struct {
	seed   uint64
	offset uint64
}

// DefaultSeed is PyTorch's default CPU seed.
const DefaultSeed = 67280421310721

// NewContext returns a Context over m with the default seed and the "cpu"
// default device.
func NewContext(m *backend.Manager) *Context {
	return &Context{Manager: m, DefaultDevice: "cpu", rng: &rngState{seed: DefaultSeed}, intr: new(atomic.Bool), blas: &blasState{}, roots: &goRoots{}, quant: &quantShared{}}
}

// ErrInterrupted is the cause of the error an op returns when it stops
// because its Context was interrupted (Ctrl-C: Python's KeyboardInterrupt).
// Test for it with errors.Is.
var ErrInterrupted = errors.New("interrupted")

// Interrupt asks the ops running in c to stop: it is the one method of a
// Context that is safe to call from another goroutine (a SIGINT handler).
// Long kernels check the flag between chunks (about a million elements of
// an elementwise, copy or reduction kernel; a panel of output rows of a
// matrix product; a node of the backward pass) and the op then returns an
// error wrapping ErrInterrupted, within milliseconds. A new op's result is
// dropped (its memory goes at the next reclaim, as any garbage's); an
// in-place or out= op may leave its destination partly written, as an
// interrupted PyTorch op does. The flag stays set, so every op fails,
// until ClearInterrupt: the Session clears it when the interrupted
// statement ends.
func (c *Context) Interrupt() {
	if c.intr != nil {
		c.intr.Store(true)
	}
}

// Interrupted reports whether Interrupt was called since the last
// ClearInterrupt. Safe from any goroutine.
func (c *Context) Interrupted() bool { return c.intr != nil && c.intr.Load() }

// ClearInterrupt resets the interrupt flag. Safe from any goroutine.
func (c *Context) ClearInterrupt() {
	if c.intr != nil {
		c.intr.Store(false)
	}
}

// stopFlag is the flag kernels poll (nil when c is nil).
func (c *Context) stopFlag() *atomic.Bool {
	if c == nil {
		return nil
	}
	return c.intr
}

// interrupted returns op fname's error when c has been interrupted, else
// nil. Ops call it after their kernels.
func (c *Context) interrupted(fname string) error {
	if c == nil || !c.Interrupted() {
		return nil
	}
	return &Error{Op: fname, Err: ErrInterrupted}
}

// ManualSeed reseeds the generator (torch.manual_seed): the counter goes
// back to 0.
func (c *Context) ManualSeed(seed uint64) { c.rng.seed, c.rng.offset = seed, 0 }

// InitialSeed returns the current seed (torch.initial_seed).
func (c *Context) InitialSeed() uint64 { return c.rng.seed }

// RNGOffset returns the generator's counter: the number of values drawn
// since the last ManualSeed.
func (c *Context) RNGOffset() uint64 { return c.rng.offset }

// draw reserves n values of the generator and returns the seed and the
// counter of the first.
func (c *Context) draw(n int) (seed, offset uint64) {
	seed, offset = c.rng.seed, c.rng.offset
	c.rng.offset += uint64(n)
	return seed, offset
}

// Device returns the canonical name of device ("cuda" → "cuda:0"); ""
// means the default device.
func (c *Context) Device(device string) (string, error) {
	if device == "" {
		device = c.defaultDevice()
	}
	return c.Manager.Canonical(device)
}

func (c *Context) defaultDevice() string {
	if c.DefaultDevice == "" {
		return "cpu"
	}
	return c.DefaultDevice
}

// SetDefaultDevice checks device and makes it the default ("" is "cpu").
// The name is kept as given (get_default_device returns it unchanged).
func (c *Context) SetDefaultDevice(device string) error {
	if device == "" {
		device = "cpu"
	}
	if _, err := c.Manager.Canonical(device); err != nil {
		return err
	}
	c.DefaultDevice = device
	return nil
}

// withManager returns a Context sharing c's generator and default device
// but allocating through m (staging, gpu_stage.go).
func (c *Context) withManager(m *backend.Manager) *Context {
	sh := *c
	sh.Manager = m
	return &sh
}
