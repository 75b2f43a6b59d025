package nn

import (
	"fmt"
	"slices"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env/refpath"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// A Layer is the Starlark value of an nn.Module (type "nn.Module"): an ordered set of
// entries — parameters, buffers, child modules and plain attributes —
// reachable as attributes, a training flag, and a forward function (a
// built-in layer's, or the user's for Module(forward, ...)). Calling the
// module calls forward.
type Layer struct {
	typ      string           // PyTorch's class name: "Linear", "Sequential", "Module"
	names    []string         // the entries' names, in order
	vals     []starlark.Value // vals[i] is the entry named names[i]
	index    map[string]int   // the position of each name in names
	kinds    map[string]entryKind
	training bool
	frozen   bool
	// forward is a built-in layer's forward; userForward a user's.
	forward     func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)
	userForward starlark.Callable
	extra       func(m *Layer) string // the repr's arguments ("in_features=4, ...")
	// indexed: Sequential and ModuleList entries are named "0", "1", ...
	indexed bool
	// outputRequiresGrad: the forward's tensor result gets
	// requires_grad_(True) (transformers' enable_input_require_grads hook
	// on the input embeddings).
	outputRequiresGrad bool
	// quant is an nn.Linear4bit's quantization state (its weight is the
	// packed Params4bit); nil for other modules.
	quant *tensor.QuantState
	// ddp is a DistributedDataParallel module's reducer and flags
	// (parallel.go); nil for other modules.
	ddp *ddpState
	// fsdp is what dist.fsdp.fully_shard keeps on the module (fsdp.go);
	// nil for other modules.
	fsdp *fsdpState
	// tp are the hooks of the tensor-parallel styles applied to the
	// module (tp.go), in the order applied.
	tp []*tpHook
	// zero is a DeepSpeed engine's ZeRO optimizer (deepspeed.go); nil
	// for other modules.
	zero zeroOptimizer
	// z3 is a module of a ZeRO-3 engine's model: its parameters'
	// gathering and release around its calls (deepspeed.go); nil for
	// other modules.
	z3 *z3Hook
	// mark is where reach walks met it (env.Walker.Visit).
	mark backend.Mark
}

type entryKind int

const (
	kindAttr entryKind = iota
	kindParam
	kindBuffer
	kindModule
)

var (
	_ starlark.HasAttrs     = (*Layer)(nil)
	_ starlark.HasSetField  = (*Layer)(nil)
	_ starlark.Callable     = (*Layer)(nil)
	_ starlark.PureCallable = (*Layer)(nil)
	_ starlark.Indexable    = (*Layer)(nil)
	_ starlark.Iterable     = (*Layer)(nil)
	_ refpath.Referrer      = (*Layer)(nil)
)

func newModule(typ string) *Layer {
	return &Layer{typ: typ, index: map[string]int{}, kinds: map[string]entryKind{}, training: true}
}

func (m *Layer) String() string {
	var b strings.Builder
	m.repr(&b, "")
	return b.String()
}

func (m *Layer) repr(b *strings.Builder, indent string) {
	b.WriteString(m.typ + "(")
	if m.extra != nil {
		b.WriteString(m.extra(m))
	}
	var kids []string
	for _, n := range m.names {
		if m.kinds[n] == kindModule {
			kids = append(kids, n)
		}
	}
	if len(kids) > 0 {
		b.WriteString("\n")
		for _, n := range kids {
			b.WriteString(indent + "  (" + n + "): ")
			m.entry(n).(*Layer).repr(b, indent+"  ")
			b.WriteString("\n")
		}
		b.WriteString(indent)
	}
	b.WriteString(")")
}

func (m *Layer) Type() string          { return "nn.Module" }
func (m *Layer) Freeze()               { m.frozen = true }
func (m *Layer) Truth() starlark.Bool  { return true }
func (m *Layer) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: %s", m.typ) }
func (m *Layer) Name() string          { return m.typ }

// set adds or replaces an entry of the given kind (keeping its position).
func (m *Layer) set(name string, v starlark.Value, k entryKind) {
	if i, ok := m.index[name]; ok {
		m.vals[i] = v
	} else {
		m.index[name] = len(m.names)
		m.names = append(m.names, name)
		m.vals = append(m.vals, v)
	}
	m.kinds[name] = k
}

// entry returns the entry called name, or nil.
func (m *Layer) entry(name string) starlark.Value {
	if i, ok := m.index[name]; ok {
		return m.vals[i]
	}
	return nil
}

// param registers a parameter (a tensor that requires grad).
func (m *Layer) param(name string, t *tensor.Tensor) {
	if t == nil {
		m.set(name, starlark.None, kindParam)
		return
	}
	m.set(name, startensor.Wrap(t), kindParam)
}

func (m *Layer) buffer(name string, t *tensor.Tensor) {
	if t == nil {
		m.set(name, starlark.None, kindBuffer)
		return
	}
	m.set(name, startensor.Wrap(t), kindBuffer)
}

func (m *Layer) child(name string, c *Layer) { m.set(name, c, kindModule) }

// tensorOf returns the engine tensor of entry name, or nil.
func (m *Layer) tensorOf(name string) *tensor.Tensor {
	if t, ok := m.entry(name).(*startensor.Tensor); ok {
		return t.Engine()
	}
	return nil
}

func (m *Layer) Attr(name string) (starlark.Value, error) {
	if v := m.entry(name); v != nil {
		return v, nil
	}
	switch name {
	case "training":
		return starlark.Bool(m.training), nil
	case "no_sync":
		if m.ddp != nil {
			return starlark.NewBuiltin(m.typ+".no_sync", ddpNoSync).BindReceiver(m), nil
		}
	case "backward":
		if m.zero != nil {
			return starlark.NewBuiltin(m.typ+".backward", dsBackward).BindReceiver(m), nil
		}
	case "step":
		if m.zero != nil {
			return starlark.NewBuiltin(m.typ+".step", dsStep).BindReceiver(m), nil
		}
	}
	if mth, ok := moduleMethods[name]; ok {
		b := starlark.NewBuiltin(m.typ+"."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return mth(thread, b.Name(), m, args, kwargs)
		})
		if pureMethods[name] {
			b.DeclarePure()
		}
		return b.BindReceiver(m), nil // the receiver, for the reclaim's reach walk
	}
	return nil, nil
}

func (m *Layer) AttrNames() []string {
	names := slices.Clone(m.names)
	names = append(names, "training")
	for k := range moduleMethods {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// SetField assigns an attribute as nn.Module.__setattr__ does: a module
// becomes a child, a Parameter a parameter (sharing it: b.weight = a.weight
// ties the two), a tensor assigned to a registered buffer stays a buffer,
// None clears a parameter or buffer, anything else a plain attribute.
func (m *Layer) SetField(name string, v starlark.Value) error {
	if m.frozen {
		return fmt.Errorf("cannot set field %s of frozen module", name)
	}
	if _, ok := moduleMethods[name]; ok || name == "training" {
		return fmt.Errorf("cannot assign to %s.%s", m.typ, name)
	}
	switch v := v.(type) {
	case *Layer:
		m.set(name, v, kindModule)
		return nil
	case *startensor.Tensor:
		if isParameter(v.Engine()) {
			m.set(name, v, kindParam)
			return nil
		}
		switch m.kinds[name] {
		case kindParam:
			return fmt.Errorf("cannot assign 'tensor' as parameter '%s' (nn.Parameter or None expected)", name)
		case kindBuffer:
			m.set(name, v, kindBuffer)
			return nil
		}
	case starlark.NoneType:
		if k, ok := m.kinds[name]; ok && (k == kindParam || k == kindBuffer) {
			m.vals[m.index[name]] = starlark.None
			return nil
		}
	}
	m.set(name, v, kindAttr)
	return nil
}

// CallInternal runs forward (inside nn.track, between its module hooks).
func (m *Layer) CallInternal(thread *starlark.Thread, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if ts := trackOf(thread); ts != nil {
		ts.enter(m)
		defer ts.tr.Exit()
	}
	var out starlark.Value
	var err error
	run := func(args starlark.Tuple) (starlark.Value, error) {
		if m.userForward != nil {
			thread.DeclareTransparent() // it holds the module and its arguments
			return starlark.Call(thread, m.userForward, append(starlark.Tuple{m}, args...), kwargs)
		} else if m.forward == nil {
			return nil, fmt.Errorf("%s: Module [%s] is missing the required \"forward\" function", m.typ, m.typ)
		}
		return m.forward(thread, m, args, kwargs)
	}
	for i := len(m.tp) - 1; i >= 0; i-- { // the first applied runs first
		h, inner := m.tp[i], run
		run = func(args starlark.Tuple) (starlark.Value, error) { return h.call(args, inner) }
	}
	if m.fsdp != nil {
		out, err = m.fsdpCall(thread, args, kwargs, run)
	} else if m.z3 != nil {
		out, err = m.z3Call(thread, args, run)
	} else {
		out, err = run(args)
	}
	if err == nil && m.outputRequiresGrad {
		// the hook's output.requires_grad_(True): a leaf (a frozen
		// embedding's output) becomes one that requires grad
		if t, ok := out.(*startensor.Tensor); ok {
			err = autograd.SetRequiresGrad(t.Engine(), true)
		}
	}
	return out, err
}

// Pure reports that calling the module changes no value that existed
// before the call but through code that says so itself
// (starlark.PureCallable): a user's forward is Starlark code, whose
// mutations move starlark.Mutations; every built-in forward makes new
// tensors, updating buffers only in their data (batch norm's running
// statistics), and one that rewrites its input (nn.ReLU(inplace=True))
// moves the counter itself, as the functional form does (inPlaceCall).
// Calls of a pure module let a reclaim keep what it found in the frames
// below (scope/reach.go).
func (m *Layer) Pure() bool { return true }

// Index, Len and Iterate serve Sequential and ModuleList.
func (m *Layer) Len() int {
	if !m.indexed {
		return 0
	}
	return len(m.names)
}

func (m *Layer) Index(i int) starlark.Value { return m.vals[i] }

func (m *Layer) Iterate() starlark.Iterator {
	var vs []starlark.Value
	if m.indexed {
		vs = slices.Clone(m.vals)
	}
	return starlark.NewList(vs).Iterate()
}

// References implements refpath.Referrer: every entry, as ".name".
func (m *Layer) References(edge func(suffix string, v starlark.Value)) {
	for i, n := range m.names {
		edge("."+n, m.vals[i])
	}
}

// namedParams walks the module tree as nn.Module._named_members: own
// entries of the kind first, then children in order (pre-order), each
// tensor once (shared parameters are listed under their first name).
func (m *Layer) namedTensors(kind entryKind, prefix string, recurse bool) (names []string, ts []*startensor.Tensor) {
	seenT := map[*tensor.Tensor]bool{}
	seenM := map[*Layer]bool{}
	var walk func(mod *Layer, prefix string)
	walk = func(mod *Layer, prefix string) {
		if seenM[mod] {
			return
		}
		seenM[mod] = true
		for i, n := range mod.names {
			if mod.kinds[n] != kind {
				continue
			}
			t, ok := mod.vals[i].(*startensor.Tensor)
			if !ok || seenT[t.Engine()] {
				continue
			}
			seenT[t.Engine()] = true
			names = append(names, prefix+n)
			ts = append(ts, t)
		}
		if !recurse {
			return
		}
		for i, n := range mod.names {
			if mod.kinds[n] == kindModule {
				walk(mod.vals[i].(*Layer), prefix+n+".")
			}
		}
	}
	walk(m, prefix)
	return names, ts
}

// modulesPreorder lists (name, module) in nn.Module.named_modules order.
func (m *Layer) modulesPreorder(prefix string) (names []string, mods []*Layer) {
	seen := map[*Layer]bool{}
	var walk func(mod *Layer, prefix string)
	walk = func(mod *Layer, prefix string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		names = append(names, prefix)
		mods = append(mods, mod)
		for i, n := range mod.names {
			if mod.kinds[n] == kindModule {
				p := n
				if prefix != "" {
					p = prefix + "." + n
				}
				walk(mod.vals[i].(*Layer), p)
			}
		}
	}
	walk(m, prefix)
	return names, mods
}

// Parameters returns the module's parameters (engine tensors), each once.
func (m *Layer) Parameters() []*tensor.Tensor {
	_, ts := m.namedTensors(kindParam, "", true)
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = t.Engine()
	}
	return out
}

// isParameter reports whether t was made by nn.Parameter or a layer.
func isParameter(t *tensor.Tensor) bool {
	if m := t.Autograd(); m != nil {
		return m.IsParameter
	}
	return false
}

// newParameter marks t as a parameter that requires grad (nn.Parameter).
func newParameter(t *tensor.Tensor, requiresGrad bool) (*tensor.Tensor, error) {
	if requiresGrad {
		if err := autograd.SetRequiresGrad(t, true); err != nil {
			return nil, err
		}
	}
	t.EnsureAutograd().IsParameter = true
	return t, nil
}
