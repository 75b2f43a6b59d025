package nn

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/dist"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// TensorParallel is dist.tensor (torch.distributed.tensor): DTensor's
// placements and, as dist.tensor.parallel, tensor parallelism's styles,
// PyTorch 2.6's (docs/reference/tensor_parallel.md):
//
//	Shard(dim)        Replicate()        Partial()
//	parallel.parallelize_module(module, device_mesh=None, parallelize_plan=None)
//	    applies a style to module, or a plan {"fqn": style} (a "*" matches
//	    any one name of the path) to its submodules; returns module
//	parallel.ColwiseParallel(input_layouts=None, output_layouts=None, use_local_output=True)
//	    nn.Linear: weight and bias Shard(0), input Replicate, output Shard(-1);
//	    nn.Embedding: weight Shard(1)
//	parallel.RowwiseParallel(input_layouts=None, output_layouts=None, use_local_output=True)
//	    nn.Linear (without bias): weight Shard(1), input Shard(-1), output
//	    Partial reduced to Replicate; nn.Embedding: weight Shard(0) (the
//	    vocabulary), input Replicate, output masked and reduced
//	parallel.SequenceParallel(sequence_dim=1, use_local_output=False)
//	    a norm (or dropout) over inputs sharded on the sequence dim
//	parallel.PrepareModuleInput(input_layouts=None, desired_input_layouts=None, use_local_output=False)
//	    redistributes a module's positional inputs
//
// A sharded parameter is this rank's torch.chunk of it (rank 0: the
// largest), a new Parameter (a tied parameter is untied, as
// distribute_tensor untied it). A tensor stays a local tensor: memsh
// tracks the placement of one a style leaves a DTensor
// (use_local_output=False) to the next style, and runs each
// redistribution's collective and, in the backward, its reverse, with
// the functional collectives' allocations. Not modelled: loss_parallel,
// uneven sharding of activations, a RowwiseParallel Linear's bias, the
// norms' Partial weight gradients (a DTensor's [dim] all-reduce), the
// masked embedding's index temporaries.
var TensorParallel = &starlarkstruct.Module{Name: "dist.tensor", Members: starlark.StringDict{
	"Shard":     starlark.NewBuiltin("dist.tensor.Shard", newShard),
	"Replicate": starlark.NewBuiltin("dist.tensor.Replicate", newReplicate),
	"Partial":   starlark.NewBuiltin("dist.tensor.Partial", newPartial),
	"parallel": &starlarkstruct.Module{Name: "dist.tensor.parallel", Members: starlark.StringDict{
		"parallelize_module": starlark.NewBuiltin("dist.tensor.parallel.parallelize_module", parallelizeModule),
		"ColwiseParallel":    starlark.NewBuiltin("dist.tensor.parallel.ColwiseParallel", newStyle("ColwiseParallel")),
		"RowwiseParallel":    starlark.NewBuiltin("dist.tensor.parallel.RowwiseParallel", newStyle("RowwiseParallel")),
		"SequenceParallel":   starlark.NewBuiltin("dist.tensor.parallel.SequenceParallel", newSequenceParallel),
		"PrepareModuleInput": starlark.NewBuiltin("dist.tensor.parallel.PrepareModuleInput", newPrepareModuleInput),
	}},
}}

func placementValue(p tdist.Placement) starlark.Value {
	switch p.Kind {
	case tdist.Shard:
		return starlarkstruct.FromStringDict(starlark.String("Shard"), starlark.StringDict{"dim": starlark.MakeInt(p.Dim)})
	case tdist.Partial:
		return starlarkstruct.FromStringDict(starlark.String("Partial"), starlark.StringDict{"reduce_op": starlark.String("sum")})
	}
	return starlarkstruct.FromStringDict(starlark.String("Replicate"), starlark.StringDict{})
}

func newShard(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var d int
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "dim", &d); err != nil {
		return nil, err
	}
	return placementValue(tdist.ShardDim(d)), nil
}

func newReplicate(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	return placementValue(tdist.Placement{Kind: tdist.Replicate}), nil
}

func newPartial(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	op := "sum"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "reduce_op?", &op); err != nil {
		return nil, err
	}
	if op != "sum" {
		return nil, fmt.Errorf("%s: reduce_op: only \"sum\" is modelled", b.Name())
	}
	return placementValue(tdist.Placement{Kind: tdist.Partial}), nil
}

// placementArg reads a placement (or a one-element tuple of one, as the
// styles accept) or None; ok is false for None.
func placementArg(fname, param string, v starlark.Value) (p tdist.Placement, ok bool, err error) {
	if v == nil || v == starlark.None {
		return p, false, nil
	}
	if t, isT := v.(starlark.Tuple); isT && len(t) == 1 {
		v = t[0]
	}
	st, isS := v.(*starlarkstruct.Struct)
	if isS {
		switch st.Constructor() {
		case starlark.String("Replicate"):
			return tdist.Placement{Kind: tdist.Replicate}, true, nil
		case starlark.String("Partial"):
			return tdist.Placement{Kind: tdist.Partial}, true, nil
		case starlark.String("Shard"):
			d, _ := st.Attr("dim")
			var k int
			if err := starlark.AsInt(d, &k); err == nil {
				return tdist.ShardDim(k), true, nil
			}
		}
	}
	return p, false, fmt.Errorf("%s: %s: got %s, want a placement (dist.tensor.Shard(dim), Replicate() or Partial())", fname, param, v.Type())
}

// style is a parallel style's settings.
type style struct {
	kind             string
	in, out          *tdist.Placement // input_layouts, output_layouts (nil: the style's default)
	useLocal         bool
	seqDim           int
	inputs, desired  []*tdist.Placement // PrepareModuleInput's, per positional input (nil: left alone)
	styleValueString string
}

// styleValue is a style as a Starlark value.
type styleValue struct{ s *style }

func (v *styleValue) String() string        { return v.s.styleValueString }
func (v *styleValue) Type() string          { return v.s.kind }
func (v *styleValue) Freeze()               {}
func (v *styleValue) Truth() starlark.Bool  { return true }
func (v *styleValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: %s", v.s.kind) }
func (v *styleValue) Reach(w *env.Walker)   {}

var _ env.Reacher = (*styleValue)(nil)

func styleString(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) string {
	var parts []string
	for _, a := range args {
		parts = append(parts, a.String())
	}
	for _, kv := range kwargs {
		parts = append(parts, fmt.Sprintf("%s=%s", kv[0].(starlark.String).GoString(), kv[1]))
	}
	name := b.Name()[strings.LastIndex(b.Name(), ".")+1:]
	return name + "(" + strings.Join(parts, ", ") + ")"
}

func newStyle(kind string) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var inV, outV starlark.Value = starlark.None, starlark.None
		useLocal := true
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input_layouts?", &inV, "output_layouts?", &outV, "use_local_output?", &useLocal); err != nil {
			return nil, err
		}
		s := &style{kind: kind, useLocal: useLocal, styleValueString: styleString(b, args, kwargs)}
		for _, x := range []struct {
			n   string
			v   starlark.Value
			dst **tdist.Placement
		}{{"input_layouts", inV, &s.in}, {"output_layouts", outV, &s.out}} {
			p, ok, err := placementArg(b.Name(), x.n, x.v)
			if err != nil {
				return nil, err
			}
			if ok {
				*x.dst = &p
			}
		}
		return &styleValue{s}, nil
	}
}

func newSequenceParallel(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	s := &style{kind: "SequenceParallel", seqDim: 1, styleValueString: styleString(b, args, kwargs)}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "sequence_dim?", &s.seqDim, "use_local_output?", &s.useLocal); err != nil {
		return nil, err
	}
	return &styleValue{s}, nil
}

func newPrepareModuleInput(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var inV, desV starlark.Value = starlark.None, starlark.None
	s := &style{kind: "PrepareModuleInput", styleValueString: styleString(b, args, kwargs)}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input_layouts?", &inV, "desired_input_layouts?", &desV, "use_local_output?", &s.useLocal); err != nil {
		return nil, err
	}
	list := func(param string, v starlark.Value) ([]*tdist.Placement, error) {
		var vs []starlark.Value
		if t, ok := v.(starlark.Tuple); ok {
			vs = t
		} else if l, ok := v.(*starlark.List); ok {
			for i := range l.Len() {
				vs = append(vs, l.Index(i))
			}
		} else {
			vs = []starlark.Value{v}
		}
		out := make([]*tdist.Placement, len(vs))
		for i, x := range vs {
			p, ok, err := placementArg(b.Name(), param, x)
			if err != nil {
				return nil, err
			}
			if ok {
				out[i] = &p
			}
		}
		return out, nil
	}
	if inV == starlark.None || desV == starlark.None {
		return nil, fmt.Errorf("%s: input_layouts and desired_input_layouts must both be given", b.Name())
	}
	var err error
	if s.inputs, err = list("input_layouts", inV); err != nil {
		return nil, err
	}
	if s.desired, err = list("desired_input_layouts", desV); err != nil {
		return nil, err
	}
	if len(s.inputs) != len(s.desired) {
		return nil, fmt.Errorf("%s: input_layouts and desired_input_layouts should have same length!", b.Name())
	}
	for i := range s.inputs {
		if (s.inputs[i] == nil) != (s.desired[i] == nil) {
			return nil, fmt.Errorf("%s: input_layouts[%d] and desired_input_layouts[%d] must both be None or both placements", b.Name(), i, i)
		}
	}
	return &styleValue{s}, nil
}

// parallelizeModule is parallelize_module(module, device_mesh=None,
// parallelize_plan=None).
func parallelizeModule(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mod *Layer
	var meshV, plan starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "module", &mod, "device_mesh?", &meshV, "parallelize_plan?", &plan); err != nil {
		return nil, err
	}
	g, e, err := dist.GroupOf(thread, b, "device_mesh", meshV)
	if err != nil {
		return nil, err
	}
	ctx := startensor.Context(e)
	type job struct {
		m *Layer
		s *style
	}
	var jobs []job
	switch p := plan.(type) {
	case starlark.NoneType:
		return mod, nil
	case *styleValue:
		jobs = append(jobs, job{mod, p.s})
	case *starlark.Dict:
		for k, v := range starlark.Entries(p) {
			key, ok := starlark.AsString(k)
			if !ok {
				return nil, fmt.Errorf("%s: parallelize_plan: key %s is not a string", b.Name(), k)
			}
			sv, ok := v.(*styleValue)
			if !ok {
				return nil, fmt.Errorf("%s: parallelize_plan[%q]: got %s, want a ParallelStyle", b.Name(), key, v.Type())
			}
			found := matchModules(mod, strings.Split(key, "."))
			if len(found) == 0 {
				return nil, fmt.Errorf("%s: parallelize_plan[%q]: no submodule matches", b.Name(), key)
			}
			for _, m := range found {
				jobs = append(jobs, job{m, sv.s})
			}
		}
	default:
		return nil, fmt.Errorf("%s: parallelize_plan: got %s, want a ParallelStyle or a dict", b.Name(), plan.Type())
	}
	for _, j := range jobs { // checked before anything changes
		if err := j.s.check(j.m); err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
	}
	for _, j := range jobs {
		if err := j.s.apply(ctx, g, j.m); err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
	}
	return mod, nil
}

// matchModules lists the submodules of m at path atoms, each atom a
// name or a path.Match pattern ("*").
func matchModules(m *Layer, atoms []string) []*Layer {
	if len(atoms) == 0 {
		return []*Layer{m}
	}
	var out []*Layer
	for i, n := range m.names {
		c, ok := m.vals[i].(*Layer)
		if !ok || m.kinds[n] != kindModule {
			continue
		}
		if ok, _ := path.Match(atoms[0], n); ok {
			out = append(out, matchModules(c, atoms[1:])...)
		}
	}
	return out
}

// check refuses what the style does not model on m, before any module
// changes.
func (s *style) check(m *Layer) error {
	switch s.kind {
	case "ColwiseParallel", "RowwiseParallel":
		if m.typ != "Linear" && m.typ != "Embedding" {
			return fmt.Errorf("%s currently only support nn.Linear and nn.Embedding! (got %s)", s.kind, m.typ)
		}
		if s.kind == "RowwiseParallel" && m.typ == "Linear" && m.tensorOf("bias") != nil {
			return fmt.Errorf("RowwiseParallel of a Linear with a bias is not modelled")
		}
	}
	return nil
}

// apply distributes m's parameters as the style does and puts its hook
// on m.
func (s *style) apply(ctx *tensor.Context, g *tdist.Group, m *Layer) error {
	shard := func(name string, p tdist.Placement) error {
		t := m.tensorOf(name)
		if t == nil {
			return nil
		}
		local, err := g.DistributeTensor(t, p)
		if err != nil || local == t {
			return err
		}
		if _, err := newParameter(local, autograd.RequiresGrad(t)); err != nil {
			return err
		}
		m.param(name, local)
		tensor.NoteHeld(ctx, &m.mark)
		tensor.Dropped(t)
		return nil
	}
	hook := &tpHook{s: s, g: g, ctx: ctx, mod: m, embedding: m.typ == "Embedding"}
	if w := m.tensorOf("weight"); w != nil && w.Dim() > 0 {
		hook.rows = w.Shape()[0]
	}
	var err error
	switch {
	case s.kind == "ColwiseParallel" && m.typ == "Linear":
		if err = shard("weight", tdist.ShardDim(0)); err == nil {
			err = shard("bias", tdist.ShardDim(0))
		}
	case s.kind == "ColwiseParallel":
		err = shard("weight", tdist.ShardDim(1))
	case s.kind == "RowwiseParallel" && m.typ == "Linear":
		err = shard("weight", tdist.ShardDim(1))
	case s.kind == "RowwiseParallel":
		err = shard("weight", tdist.ShardDim(0))
	}
	if err != nil {
		return err
	}
	m.tp = append(m.tp, hook)
	return nil
}

// tpHook is a style's forward pre- and post-hook on a module.
type tpHook struct {
	s         *style
	g         *tdist.Group
	ctx       *tensor.Context
	mod       *Layer
	embedding bool
	rows      int // a RowwiseParallel Embedding's rows before sharding
}

var replicate = tdist.Placement{Kind: tdist.Replicate}

// dtensor returns x as a DTensor: as a style left it, or placed as
// declared (from_local), its gradient taken to arrive placed so until a
// consumer says otherwise (a ColwiseParallel Linear: Partial).
func (h *tpHook) dtensor(x *tensor.Tensor, declared tdist.Placement) (*tensor.Tensor, tdist.DTensor, error) {
	if d, ok := tdist.TagOf(x); ok {
		return x, d, nil
	}
	grad := &tdist.GradPlacement{P: declared}
	y, err := h.g.FromLocal(x, declared, grad)
	return y, tdist.DTensor{Placement: declared, Grad: grad}, err
}

// to redistributes a DTensor to placement p; its result's gradient
// arrives as grad.
func (h *tpHook) to(x *tensor.Tensor, d tdist.DTensor, p tdist.Placement, grad *tdist.GradPlacement) (*tensor.Tensor, tdist.DTensor, error) {
	if d.Placement.Equal(p, x.Dim()) {
		return x, d, nil
	}
	y, err := h.g.Redistribute(x, d.Placement, p, grad)
	return y, tdist.DTensor{Placement: p, Grad: grad}, err
}

// output ends the forward: a DTensor tagged for the next style, or a
// local tensor (to_local: the same tensor).
func (h *tpHook) output(y *tensor.Tensor, d tdist.DTensor, local bool) starlark.Value {
	if !local {
		tdist.Tag(y, d)
	}
	return startensor.Wrap(y)
}

func firstTensor(fname string, args starlark.Tuple) (*tensor.Tensor, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: the module's input must be a positional tensor", fname)
	}
	t, ok := args[0].(*startensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: the module's input must be a tensor, got %s", fname, args[0].Type())
	}
	return t.Engine(), nil
}

// call runs the module's forward run under the style.
func (h *tpHook) call(args starlark.Tuple, run func(starlark.Tuple) (starlark.Value, error)) (starlark.Value, error) {
	s := h.s
	fname := s.kind
	if s.kind == "PrepareModuleInput" {
		return h.prepareInput(args, run)
	}
	x, err := firstTensor(fname, args)
	if err != nil {
		return nil, err
	}
	release := h.ctx.Hold(x)
	defer release()
	partial := tdist.Placement{Kind: tdist.Partial}
	switch {
	case s.kind == "SequenceParallel":
		sp := tdist.ShardDim(s.seqDim)
		y, err := h.runOn(run, args, x, sp, sp, sp)
		if err != nil {
			return nil, err
		}
		return h.output(y, tdist.DTensor{Placement: sp, Grad: &tdist.GradPlacement{P: sp}}, s.useLocal), nil
	case s.kind == "ColwiseParallel":
		// the input redistributed to Replicate; a Linear's gradient of
		// it is Partial
		y, err := h.runOn(run, args, x, orPlacement(s.in, replicate), replicate, partial)
		if err != nil {
			return nil, err
		}
		out := tdist.ShardDim(-1)
		return h.finish(y, tdist.DTensor{Placement: out}, orPlacement(s.out, out))
	case s.kind == "RowwiseParallel" && h.embedding:
		// MaskPartial: the ids masked to this rank's rows, the output's
		// masked rows zeroed before its reduction (DTensor's embedding
		// op in place of the module's)
		pad := int64(-1)
		if p, ok := h.mod.entry("padding_idx").(starlark.Int); ok {
			pad, _ = p.Int64()
		}
		y, err := h.g.MaskedEmbedding(h.mod.tensorOf("weight"), x, h.rows, pad)
		if err != nil {
			return nil, err
		}
		return h.finish(y, tdist.DTensor{Placement: partial}, orPlacement(s.out, replicate))
	default: // RowwiseParallel of a Linear
		want := tdist.ShardDim(-1)
		y, err := h.runOn(run, args, x, orPlacement(s.in, want), want, want)
		if err != nil {
			return nil, err
		}
		return h.finish(y, tdist.DTensor{Placement: partial}, orPlacement(s.out, replicate))
	}
}

// runOn runs the forward on x made the module's input: a DTensor placed
// as declared (or as a style left it), redistributed to want; the
// gradient of the input the forward takes arrives placed as grad (a
// DTensor already placed as want learns it so).
func (h *tpHook) runOn(run func(starlark.Tuple) (starlark.Value, error), args starlark.Tuple, x *tensor.Tensor, declared, want, grad tdist.Placement) (*tensor.Tensor, error) {
	x, d, err := h.dtensor(x, declared)
	if err != nil {
		return nil, err
	}
	if d.Placement.Equal(want, x.Dim()) && d.Grad != nil {
		d.Grad.P = grad
	}
	if x, _, err = h.to(x, d, want, &tdist.GradPlacement{P: grad}); err != nil {
		return nil, err
	}
	h.ctx.Hold(x)
	return h.run(run, args, x)
}

func orPlacement(p *tdist.Placement, def tdist.Placement) tdist.Placement {
	if p != nil {
		return *p
	}
	return def
}

// run calls the forward with x as its first argument.
func (h *tpHook) run(run func(starlark.Tuple) (starlark.Value, error), args starlark.Tuple, x *tensor.Tensor) (*tensor.Tensor, error) {
	a := slices.Clone(args)
	a[0] = startensor.Wrap(x)
	v, err := run(a)
	if err != nil {
		return nil, err
	}
	y, ok := v.(*startensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: the module's output must be a tensor, got %s", h.s.kind, v.Type())
	}
	return y.Engine(), nil
}

// finish redistributes the module's output y (placed as d) to the
// output layout; its gradient arrives placed there.
func (h *tpHook) finish(y *tensor.Tensor, d tdist.DTensor, to tdist.Placement) (starlark.Value, error) {
	grad := &tdist.GradPlacement{P: to}
	// y is the forward's output, which only this code holds while the
	// redistribution allocates (a walk must reach it, not leave it to a
	// collection)
	release := h.ctx.Hold(y)
	z, nd, err := h.to(y, d, to, grad)
	release()
	if err != nil {
		return nil, err
	}
	if z != y {
		tensor.Dropped(y)
	}
	if nd.Grad == nil {
		nd.Grad = grad
	}
	return h.output(z, nd, h.s.useLocal), nil
}

// prepareInput is PrepareModuleInput's pre-hook: each positional input
// with a layout becomes a DTensor placed as declared and is
// redistributed to the desired layout.
func (h *tpHook) prepareInput(args starlark.Tuple, run func(starlark.Tuple) (starlark.Value, error)) (starlark.Value, error) {
	s := h.s
	a := slices.Clone(args)
	release := h.ctx.Hold()
	defer release()
	for i, p := range s.inputs {
		if p == nil || i >= len(a) {
			continue
		}
		t, ok := a[i].(*startensor.Tensor)
		if !ok {
			return nil, fmt.Errorf("PrepareModuleInput: input %d is %s, not a tensor", i, a[i].Type())
		}
		want := *s.desired[i]
		grad := &tdist.GradPlacement{P: want}
		x, d, err := h.dtensor(t.Engine(), *p)
		if err == nil {
			x, d, err = h.to(x, d, want, grad)
		}
		if err != nil {
			return nil, err
		}
		if d.Grad == nil {
			d.Grad = grad
		}
		h.ctx.Hold(x)
		if !s.useLocal {
			tdist.Tag(x, d)
		}
		a[i] = startensor.Wrap(x)
	}
	return run(a)
}
