package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Frozen parameters and the Hugging Face PreTrainedModel methods that
// fine-tuning code calls on a model: Module.requires_grad_ (PyTorch),
// num_parameters, enable_input_require_grads and
// gradient_checkpointing_enable (transformers' modeling_utils).

// methodRequiresGrad is Module.requires_grad_(requires_grad=True): every
// parameter's requires_grad set (a frozen parameter gets no gradient, no
// AccumulateGrad node and no optimizer state); returns the module.
func methodRequiresGrad(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	on := true
	if err := starlark.UnpackArgs(f, args, kwargs, "requires_grad?", &on); err != nil {
		return nil, err
	}
	names, ts := m.namedTensors(kindParam, "", true)
	for i, t := range ts {
		if err := autograd.SetRequiresGrad(t.Engine(), on); err != nil {
			return nil, fmt.Errorf("%s: parameter %s (%s): %w", f, names[i], t.Engine().DType(), err)
		}
	}
	return m, nil
}

// methodNumParameters is transformers' PreTrainedModel.num_parameters(
// only_trainable=False, exclude_embeddings=False): the parameters'
// element count, each tensor once; only_trainable counts those that
// require grad; exclude_embeddings leaves out the weights of nn.Embedding
// modules. A 4-bit packed weight (nn.Linear4bit's Params4bit, uint8
// storage) counts numel × 2, the weights it packs, as transformers counts
// it.
func methodNumParameters(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var onlyTrainable, excludeEmbeddings bool
	if err := starlark.UnpackArgs(f, args, kwargs, "only_trainable?", &onlyTrainable, "exclude_embeddings?", &excludeEmbeddings); err != nil {
		return nil, err
	}
	return starlark.MakeInt64(m.numParameters(onlyTrainable, excludeEmbeddings)), nil
}

// numParameters counts as num_parameters does.
func (m *Layer) numParameters(onlyTrainable, excludeEmbeddings bool) int64 {
	skip := map[string]bool{}
	packed := map[*startensor.Tensor]bool{}
	names, mods := m.modulesPreorder("")
	for i, c := range mods {
		if excludeEmbeddings && c.typ == "Embedding" {
			n := "weight"
			if names[i] != "" {
				n = names[i] + ".weight"
			}
			skip[n] = true
		}
		if c.quant != nil {
			if w, ok := c.entry("weight").(*startensor.Tensor); ok {
				packed[w] = true
			}
		}
	}
	var n int64
	pnames, ts := m.namedTensors(kindParam, "", true)
	for i, t := range ts {
		if skip[pnames[i]] {
			continue
		}
		if onlyTrainable && !autograd.RequiresGrad(t.Engine()) {
			continue
		}
		k := int64(t.Engine().Numel())
		if packed[t] {
			k *= 2 * int64(t.Engine().DType().Size())
		}
		n += k
	}
	return n
}

// inputEmbeddings is transformers' get_input_embeddings for the models
// memsh builds: the first nn.Embedding in named_modules() order
// (model.embed_tokens, transformer.wte).
func (m *Layer) inputEmbeddings() *Layer {
	_, mods := m.modulesPreorder("")
	for _, c := range mods {
		if c.typ == "Embedding" {
			return c
		}
	}
	return nil
}

// setInputRequireGrads is enable_input_require_grads() (on) and
// disable_input_require_grads(): transformers registers a forward hook on
// the input embeddings that calls output.requires_grad_(True), so that
// the first layer's input requires grad even when the embedding weight is
// frozen (what reentrant checkpointing needs; it also makes the frozen
// layers below the first trainable one save what their input's gradient
// needs). memsh's hook is a flag on the embedding module (CallInternal).
func setInputRequireGrads(f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple, on bool) error {
	if err := starlark.UnpackArgs(f, args, kwargs); err != nil {
		return err
	}
	emb := m.inputEmbeddings()
	if emb == nil {
		return fmt.Errorf("%s: %s has no nn.Embedding (its input embeddings, get_input_embeddings())", f, m.typ)
	}
	emb.outputRequiresGrad = on
	return nil
}

// setGradientCheckpointing is gradient_checkpointing_enable(
// gradient_checkpointing_kwargs=None) (on) and
// gradient_checkpointing_disable(): as transformers'
// _set_gradient_checkpointing, every module of the tree with a
// gradient_checkpointing attribute gets it set (models/decoder.star's
// model and hf.star's GPT-2 have one: their layers then run under
// nn.checkpoint in training). memsh's checkpointing is non-reentrant
// (transformers' default is reentrant): gradient_checkpointing_kwargs may
// say use_reentrant=False, and use_reentrant=True is an error. A model
// without the attribute is transformers' error.
func setGradientCheckpointing(f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple, on bool) error {
	var kw starlark.Value = starlark.None
	if on {
		if err := starlark.UnpackArgs(f, args, kwargs, "gradient_checkpointing_kwargs?", &kw); err != nil {
			return err
		}
	} else if err := starlark.UnpackArgs(f, args, kwargs); err != nil {
		return err
	}
	if err := checkReentrant(f, kw); err != nil {
		return err
	}
	found := false
	_, mods := m.modulesPreorder("")
	for _, c := range mods {
		if k, ok := c.kinds["gradient_checkpointing"]; ok && k == kindAttr {
			c.set("gradient_checkpointing", starlark.Bool(on), kindAttr)
			found = true
		}
	}
	if !found {
		return fmt.Errorf("%s: %s does not support gradient checkpointing (no module of it has a gradient_checkpointing attribute)", f, m.typ)
	}
	return nil
}

// checkReentrant reads gradient_checkpointing_kwargs (None or a dict):
// only use_reentrant=False (or absent) is memsh's checkpointing.
func checkReentrant(f string, kw starlark.Value) error {
	if kw == starlark.None {
		return nil
	}
	d, ok := kw.(*starlark.Dict)
	if !ok {
		return fmt.Errorf("%s: gradient_checkpointing_kwargs: got %s, want dict or None", f, kw.Type())
	}
	for _, it := range d.Items() {
		k, _ := starlark.AsString(it[0])
		switch k {
		case "use_reentrant":
			if it[1] == starlark.True {
				return fmt.Errorf("%s: gradient_checkpointing_kwargs: use_reentrant=True is not supported (memsh's nn.checkpoint is non-reentrant)", f)
			}
		case "preserve_rng_state":
		default:
			return fmt.Errorf("%s: gradient_checkpointing_kwargs: %q is not supported (use_reentrant, preserve_rng_state)", f, k)
		}
	}
	return nil
}
