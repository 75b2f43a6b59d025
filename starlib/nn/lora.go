package nn

import (
	_ "embed"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
	startensor "github.com/memsh/memsh/starlib/tensor"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// LoRA as PEFT injects it (get_peft_model with a LoraConfig, PEFT 0.1x:
// peft/tuners/lora/layer.py, tuners_utils.py, written from them):
//
//	nn.lora(model, r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None,
//	        use_rslora=False, autocast_adapter_dtype=True)
//
// In place, returning model: every target nn.Linear or nn.Linear4bit
// becomes a lora.Linear module with PEFT's children — base_layer (the
// original), lora_dropout.default (nn.Dropout(lora_dropout), or
// nn.Identity at 0), lora_A.default (nn.Linear(in, r, bias=False):
// kaiming_uniform_(a=√5)), lora_B.default (nn.Linear(r, out, bias=False):
// zeros) — so the parameter names are PEFT's below its base_model.model
// prefix (model.layers.0.self_attn.q_proj.lora_A.default.weight). Then
// every parameter whose name has no "lora_" is frozen (bias="none").
//
// The adapters' dtype is PEFT's: made in the base layer's dtype (a
// Linear4bit's compute_dtype, float32 when it has none), then, with
// autocast_adapter_dtype (get_peft_model's default), float16 and
// bfloat16 ones cast to float32 — all adapters made first, then each
// cast in turn (the float32 copy made before the half one is freed).
// scaling = lora_alpha / r (lora_alpha / √r with use_rslora).
//
// The forward (lora.star) is PEFT's Linear.forward: result =
// base_layer(x); x cast to the adapter's dtype when it differs; result =
// result + lora_B(lora_A(dropout(x))) * scaling; result cast back to the
// base result's dtype.
//
// target_modules: a list of names, each matching a module whose dotted
// name is it or ends with "." + it (PEFT's check_target_module_exists);
// a string is a regular expression the whole name must match, or
// "all-linear" (every Linear and Linear4bit but lm_head, the output
// layer); None is q_proj and v_proj (PEFT's default for the Llama
// family: TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). No module
// matching, or a match that is neither nn.Linear nor nn.Linear4bit, is
// an error; so is a module that already has an adapter.

//go:embed lora.star
var loraSrc string

// loraForward is lora.star's forward, compiled once.
var loraForward = sync.OnceValues(func() (starlark.Callable, error) {
	thread := &starlark.Thread{Name: "nn.lora"}
	g, err := starlark.ExecFileOptions(&syntax.FileOptions{}, thread, "nn/lora.star", loraSrc, nil)
	if err != nil {
		return nil, err
	}
	g.Freeze()
	return g["forward"].(*starlark.Function), nil
})

func init() { register("lora", newLoRA) }

// loraTarget is a module nn.lora wraps: its parent, its name in the
// parent and its dotted name.
type loraTarget struct {
	parent *Layer
	name   string
	full   string
	mod    *Layer
}

func newLoRA(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	f := b.Name()
	var model *Layer
	r := 8
	var alphaV starlark.Value = starlark.MakeInt(8)
	var dropV starlark.Value = starlark.Float(0)
	var targetsV starlark.Value = starlark.None
	rslora, upcast := false, true
	if err := starlark.UnpackArgs(f, args, kwargs, "model", &model, "r?", &r, "lora_alpha?", &alphaV, "lora_dropout?", &dropV,
		"target_modules?", &targetsV, "use_rslora?", &rslora, "autocast_adapter_dtype?", &upcast); err != nil {
		return nil, err
	}
	if r <= 0 {
		return nil, fmt.Errorf("%s: r: `r` should be a positive integer value but the value passed is %d", f, r)
	}
	alpha, ok := starlark.AsFloat(alphaV)
	if !ok {
		return nil, fmt.Errorf("%s: lora_alpha: got %s, want a number", f, alphaV.Type())
	}
	p, err := dropoutP(f, dropV)
	if err != nil {
		return nil, fmt.Errorf("%w (lora_dropout)", err)
	}
	match, err := loraMatcher(f, targetsV)
	if err != nil {
		return nil, err
	}
	fwd, err := loraForward()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	var targets []loraTarget
	for _, t := range model.moduleTree() {
		if !match(t.full, t.mod) {
			continue
		}
		switch {
		case t.mod.typ == "lora.Linear" || t.parent != nil && t.parent.typ == "lora.Linear":
			return nil, fmt.Errorf("%s: target module %s already has a LoRA adapter", f, t.full)
		case t.mod.typ != "Linear" && t.mod.typ != "Linear4bit":
			return nil, fmt.Errorf("%s: target module %s (%s) is not supported: memsh's LoRA wraps nn.Linear and nn.Linear4bit", f, t.full, t.mod.typ)
		case t.parent == nil:
			return nil, fmt.Errorf("%s: the model itself (%s) cannot be a target: pass the model that holds it", f, t.mod.typ)
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("%s: target_modules %s not found in the base model. Please check the target modules and try again", f, targetsV)
	}
	scaling := alpha / float64(r)
	if rslora {
		scaling = alpha / math.Sqrt(float64(r))
	}
	c, err := ctxOf(thread, f)
	if err != nil {
		return nil, err
	}
	// inject_adapter: each target's adapter made on its base layer's
	// device and in its dtype. A Quiet region (backend.Manager.Quiet):
	// it runs no Starlark and lets go of nothing but the half adapters
	// it casts (Dropped), so exact mode reclaims before a peak only
	// when something may have become garbage, not at each adapter.
	if c.Manager != nil {
		defer c.Manager.Quiet()()
	}
	defer c.Hold()() // releases the adapters' holds below
	wrapped := make([]*Layer, len(targets))
	for i, t := range targets {
		base := t.mod
		w := base.tensorOf("weight")
		if w == nil {
			return nil, fmt.Errorf("%s: target module %s has no weight", f, t.full)
		}
		in, out := w.Shape()[1], w.Shape()[0]
		dt := w.DType()
		if base.quant != nil {
			in, out = base.quant.Shape[1], base.quant.Shape[0]
			dt = tensor.Float32 // a Linear4bit: its compute_dtype, if set
			if cd, ok := base.entry("compute_dtype").(startensor.DType); ok {
				dt = cd.Engine()
			}
		}
		a, err := tnn.Param(c, []int{r, in}, w.Device(), dt)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", f, t.full, err)
		}
		c.Hold(a)
		if err := tnn.KaimingUniform_(a, math.Sqrt(5), in); err != nil {
			return nil, err
		}
		bw, err := tnn.Filled(c, []int{out, r}, 0, w.Device(), dt, true)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", f, t.full, err)
		}
		c.Hold(bw)
		wrapped[i] = loraLayer(base, a, bw, p, r, alpha, scaling, fwd)
	}
	for i, t := range targets {
		t.parent.set(t.name, wrapped[i], kindModule)
	}
	// _mark_only_adapters_as_trainable (bias="none")
	names, ts := model.namedTensors(kindParam, "", true)
	for i, t := range ts {
		if !strings.Contains(names[i], "lora_") {
			if err := autograd.SetRequiresGrad(t.Engine(), false); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", f, names[i], err)
			}
		}
	}
	// cast_adapter_dtype: half adapters to float32
	if upcast {
		for _, l := range wrapped {
			for _, d := range []string{"lora_A", "lora_B"} {
				w := l.entry(d).(*Layer).entry("default").(*Layer).tensorOf("weight")
				if dt := w.DType(); dt == tensor.Float16 || dt == tensor.BFloat16 {
					if err := convertInPlace(w, "", tensor.Float32); err != nil {
						return nil, fmt.Errorf("%s: %w", f, err)
					}
				}
			}
		}
	}
	return model, nil
}

// loraLayer is PEFT's lora.Linear over base with adapter weights a
// [r, in] and b [out, r].
func loraLayer(base *Layer, a, b *tensor.Tensor, p float64, r int, alpha, scaling float64, fwd starlark.Callable) *Layer {
	dict := func(m *Layer) *Layer {
		d := newModule("ModuleDict")
		d.child("default", m)
		return d
	}
	var drop *Layer
	if p > 0 {
		drop = dropoutLayer(starlark.Float(p), false)
	} else {
		drop = identityLayer()
	}
	one := func(v starlark.Value) *starlark.Dict {
		d := starlark.NewDict(1)
		_ = d.SetKey(starlark.String("default"), v)
		d.Freeze()
		return d
	}
	m := newModule("lora.Linear")
	m.child("base_layer", base)
	m.child("lora_dropout", dict(drop))
	m.child("lora_A", dict(linearLayer(a, nil)))
	m.child("lora_B", dict(linearLayer(b, nil)))
	in, out := a.Shape()[1], b.Shape()[0]
	m.set("in_features", starlark.MakeInt(in), kindAttr)
	m.set("out_features", starlark.MakeInt(out), kindAttr)
	m.set("r", one(starlark.MakeInt(r)), kindAttr)
	m.set("lora_alpha", one(starlark.Float(alpha)), kindAttr)
	m.set("scaling", one(starlark.Float(scaling)), kindAttr)
	m.set("cast_input_dtype_enabled", starlark.True, kindAttr)
	m.userForward = fwd
	return m
}

// moduleTree lists the modules under m in named_modules() order, each
// once, with its parent and its name there (the root's parent is nil).
func (m *Layer) moduleTree() []loraTarget {
	var out []loraTarget
	seen := map[*Layer]bool{}
	var walk func(parent *Layer, name, full string, mod *Layer)
	walk = func(parent *Layer, name, full string, mod *Layer) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		out = append(out, loraTarget{parent: parent, name: name, full: full, mod: mod})
		for i, n := range mod.names {
			if mod.kinds[n] == kindModule {
				sub := n
				if full != "" {
					sub = full + "." + n
				}
				walk(mod, n, sub, mod.vals[i].(*Layer))
			}
		}
	}
	walk(nil, "", "", m)
	return out
}

// loraMatcher reads target_modules into a predicate over (dotted name,
// module).
func loraMatcher(f string, v starlark.Value) (func(full string, m *Layer) bool, error) {
	suffixes := func(names []string) func(string, *Layer) bool {
		return func(full string, _ *Layer) bool {
			return slices.ContainsFunc(names, func(t string) bool { return full == t || strings.HasSuffix(full, "."+t) })
		}
	}
	switch v := v.(type) {
	case starlark.NoneType:
		return suffixes([]string{"q_proj", "v_proj"}), nil
	case starlark.String:
		s := string(v)
		if s == "all-linear" {
			return func(full string, m *Layer) bool {
				last := full[strings.LastIndex(full, ".")+1:]
				return (m.typ == "Linear" || m.typ == "Linear4bit") && last != "lm_head"
			}, nil
		}
		re, err := regexp.Compile("^(?:" + s + ")$")
		if err != nil {
			return nil, fmt.Errorf("%s: target_modules: %w", f, err)
		}
		return func(full string, _ *Layer) bool { return full != "" && re.MatchString(full) }, nil
	case starlark.Iterable:
		var names []string
		it := v.Iterate()
		defer it.Done()
		var x starlark.Value
		for it.Next(&x) {
			s, ok := starlark.AsString(x)
			if !ok {
				return nil, fmt.Errorf("%s: target_modules: got a %s in the list, want module names (str)", f, x.Type())
			}
			names = append(names, s)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: target_modules: an empty list", f)
		}
		return suffixes(names), nil
	}
	return nil, fmt.Errorf("%s: target_modules: got %s, want a list of module names, a regular expression, \"all-linear\" or None", f, v.Type())
}

func init() { register("prepare_model_for_kbit_training", prepareKbit) }

// prepareKbit is PEFT's prepare_model_for_kbit_training(model,
// use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None)
// (peft/utils/other.py), returning model: every parameter frozen; every
// float16 or bfloat16 parameter that is not a 4-bit weight cast to
// float32 in place (param.data = param.data.to(float32)), then
// torch.cuda.empty_cache() (auto_clear_cache); and, for a model with
// nn.Linear4bit layers and use_gradient_checkpointing,
// enable_input_require_grads() unless gradient_checkpointing_kwargs says
// use_reentrant=False, then gradient_checkpointing_enable(
// gradient_checkpointing_kwargs) (memsh's checkpointing is the
// non-reentrant one whatever the kwargs say).
func prepareKbit(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	f := b.Name()
	var model *Layer
	useGC := true
	var kw starlark.Value = starlark.None
	if err := starlark.UnpackArgs(f, args, kwargs, "model", &model, "use_gradient_checkpointing?", &useGC, "gradient_checkpointing_kwargs?", &kw); err != nil {
		return nil, err
	}
	if err := checkReentrant(f, kw); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, f)
	if err != nil {
		return nil, err
	}
	quantized := false
	for _, t := range model.moduleTree() {
		quantized = quantized || t.mod.quant != nil
	}
	names, ts := model.namedTensors(kindParam, "", true)
	for i, t := range ts {
		if err := autograd.SetRequiresGrad(t.Engine(), false); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", f, names[i], err)
		}
	}
	for _, t := range ts {
		if dt := t.Engine().DType(); dt == tensor.Float16 || dt == tensor.BFloat16 {
			if err := convertInPlace(t.Engine(), "", tensor.Float32); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	m := e.Manager
	m.Reclaim()
	for i := 0; i < m.NumGPUs(); i++ {
		m.GPU(i).EmptyCache()
	}
	if quantized && useGC {
		reentrant := true
		if d, ok := kw.(*starlark.Dict); ok {
			if v, found, _ := d.Get(starlark.String("use_reentrant")); found {
				reentrant = v == starlark.True
			}
		}
		if reentrant {
			if err := setInputRequireGrads(f, model, nil, nil, true); err != nil {
				return nil, err
			}
		}
		var gkw []starlark.Tuple
		if kw != starlark.None {
			gkw = []starlark.Tuple{{starlark.String("gradient_checkpointing_kwargs"), kw}}
		}
		if err := setGradientCheckpointing(f, model, nil, gkw, true); err != nil {
			return nil, err
		}
	}
	return model, nil
}
