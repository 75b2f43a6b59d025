// Package nn is the Starlark binding of memsh's neural-network layers
// (PyTorch's torch.nn): Module values with PyTorch's constructors,
// parameter names and default initialisations, and the nn.functional
// sub-module. The layers' arithmetic is the tensor engine's autograd ops
// (tensor/autograd); this package only unpacks arguments, holds the module
// tree and calls them.
//
// Members of nn (each file registers its own in init):
//
//	Linear(in_features, out_features, bias=True, device=None, dtype=None)
//	Embedding(num_embeddings, embedding_dim, padding_idx=None, device=None, dtype=None)
//	LayerNorm(normalized_shape, eps=1e-05, elementwise_affine=True, bias=True, device=None, dtype=None)
//	RMSNorm(normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None)
//	Dropout(p=0.5)  ReLU()  GELU(approximate="none")  SiLU()  Tanh()  Sigmoid()
//	Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True, device=None, dtype=None)
//	BatchNorm2d(num_features, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True, device=None, dtype=None)
//	MaxPool2d(kernel_size, stride=None, padding=0, dilation=1)
//	Flatten(start_dim=1, end_dim=-1)
//	Sequential(*modules)  ModuleList(modules=None)
//	Parameter(data, requires_grad=True)
//	Module(forward, **children)
//	Identity()  CrossEntropyLoss(...)  MSELoss(...)
//	autocast(fn, *args, dtype="bfloat16", enabled=True, **kwargs)   (autocast.go)
//	checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, **kwargs) (checkpoint.go)
//	sdpa_kernel(backends, fn, *args, **kwargs)  sdpa_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False)
//	    scaled_dot_product_attention's backends: "math", "flash", "efficient", "cudnn" (sdpa_kernel.go)
//	track(fn, *args, **kwargs)                                      (track.go)
//	lora(model, r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None, use_rslora=False,
//	     autocast_adapter_dtype=True)                               PEFT's LoRA (lora.go)
//	prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
//	     gradient_checkpointing_kwargs=None)                        PEFT's (lora.go)
//	Linear4bit(input_features, output_features, bias=True, compute_dtype=None,
//	     compress_statistics=True, quant_type="fp4", quant_storage="uint8",
//	     device=None, dtype=None)                                   bitsandbytes' (layers_quant.go)
//	functional: the functional forms (see functional.go)
//	utils: clip_grad_norm_, get_total_norm, clip_grads_with_norm_   (clip_grad.go)
//	parallel: DistributedDataParallel(module, ...)                   (parallel.go)
//
// Conv2d and nn.functional.conv2d model cudnn_convolution's tensors only:
// the cuDNN workspace (its size depends on the algorithm cuDNN picks) is
// not modelled, so memsh allocates none; likewise cudnn_batch_norm's
// workspace and reserve space (0 bytes here).
//
// Module methods: parameters(), named_parameters(prefix="", recurse=True),
// buffers(), named_buffers(), children(), named_children(), modules(),
// named_modules(), train(mode=True), eval(), to(device=None, dtype=None),
// zero_grad(set_to_none=True), register_buffer(name, tensor), forward(...),
// requires_grad_(requires_grad=True), and transformers' num_parameters(
// only_trainable=False, exclude_embeddings=False),
// enable_input_require_grads(), disable_input_require_grads(),
// gradient_checkpointing_enable(gradient_checkpointing_kwargs=None),
// gradient_checkpointing_disable() (frozen.go).
package nn

import (
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
)

// Module is the nn module.
var Module = &starlarkstruct.Module{Name: "nn", Members: starlark.StringDict{}}

// Functional is nn.functional.
var Functional = &starlarkstruct.Module{Name: "nn.functional", Members: starlark.StringDict{}}

func init() { Module.Members["functional"] = Functional }

type builtinFn = func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

// register adds nn.<name>.
func register(name string, fn builtinFn) { Module.Members[name] = starlark.NewBuiltin("nn."+name, fn) }

// registerPure adds nn.<name>, declared pure (starlark.Builtin.DeclarePure):
// for the layers' constructors, which make new values (a module holding
// the ones it is given changes none of them), and the built-ins that call
// the function they are given under a mode of the tensor Context
// (checkpoint, autocast, sdpa_kernel) and change no existing value
// themselves; what the function changes moves starlark.Mutations itself.
// A reclaim inside one then keeps the frames below it (scope/reach.go):
// building a model allocates its parameters inside constructors.
func registerPure(name string, fn builtinFn) {
	Module.Members[name] = starlark.NewBuiltin("nn."+name, fn).DeclarePure()
}

// registerF adds nn.functional.<name>, declared pure
// (starlark.Builtin.DeclarePure): the functional forms make new tensors
// and change existing ones only in their data (batch_norm's running
// statistics); one that rewrites its input (relu's inplace=True) moves
// the thread's Mutations itself (inPlaceCall).
func registerF(name string, fn builtinFn) {
	Functional.Members[name] = starlark.NewBuiltin("nn.functional."+name, fn).DeclarePure()
}

// inPlaceCall moves the thread's Mutations before an op rewrites its input in
// place (its autograd state can change) and returns what moves it again
// after: what a built-in or module that is pure does instead of being
// impure when it rewrites its input.
func inPlaceCall(thread *starlark.Thread) (done func()) {
	thread.Mutated()
	return thread.Mutated
}
