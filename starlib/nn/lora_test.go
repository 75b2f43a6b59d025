package nn_test

import (
	"bytes"
	"fmt"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
)

// TestLoRAClosedForms checks nn.lora on a small Llama (hidden h = 64,
// 4 heads of 16, 2 key-value heads, intermediate 128, 2 layers) against
// closed forms, for the q_proj/v_proj default and "all-linear" at r = 8:
//
//   - trainable parameters: Σ over the targets of r × (in + out);
//   - gradients after backward: one float32 tensor per adapter weight,
//     r × in and out × r elements, each rounded to 512 bytes — the
//     frozen parameters get none;
//   - AdamW's state after the first step: two tensors per adapter
//     weight (exp_avg, exp_avg_sq), so twice the gradients' bytes: the
//     allocated bytes after the step less before it.
func TestLoRAClosedForms(t *testing.T) {
	const h, heads, kv, hd, inter, layers, r = 64, 4, 2, 16, 128, 2, 8
	type lin struct{ in, out int }
	all := map[string]lin{
		"q_proj": {h, heads * hd}, "k_proj": {h, kv * hd}, "v_proj": {h, kv * hd}, "o_proj": {heads * hd, h},
		"gate_proj": {h, inter}, "up_proj": {h, inter}, "down_proj": {inter, h},
	}
	round := func(b int) int64 { return int64((b + 511) / 512 * 512) }
	for _, tc := range []struct {
		targets string
		names   []string
	}{
		{"None", []string{"q_proj", "v_proj"}},
		{`"all-linear"`, []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
	} {
		var params, grads int64
		for _, n := range tc.names {
			l := all[n]
			params += int64(layers * r * (l.in + l.out))
			grads += int64(layers) * (round(r*l.in*4) + round(l.out*r*4))
		}
		var out bytes.Buffer
		s, err := scope.New(scope.Options{Device: "sim:8GiB", Out: &out, Err: &out, Quiet: true, Library: scripts.Library})
		if err != nil {
			t.Fatal(err)
		}
		code := fmt.Sprintf(`
load("models/hf.star", "from_config")
cfg = {"model_type": "llama", "hidden_size": %d, "intermediate_size": %d, "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d, "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": False}
model = from_config(cfg, device = "cuda")
nn.lora(model, r = %d, lora_alpha = 16, target_modules = %s)
TRAINABLE = model.num_parameters(only_trainable = True)
opt = optim.AdamW(model.parameters(), lr = 1e-3)
x = tensor.randint(0, 256, [2, 16], device = "cuda")
loss = model(x, x.clone())
loss.backward()
loss = None
GRADS = 0
FROZEN_GRADS = 0
for p in model.parameters():
    if p.grad != None:
        GRADS += (p.grad.nbytes + 511) // 512 * 512
        if not p.requires_grad:
            FROZEN_GRADS += 1
BEFORE = cuda.memory_allocated()
opt.step()
STATE = cuda.memory_allocated() - BEFORE
`, h, inter, layers, heads, kv, r, tc.targets)
		if err := s.Exec("lora.star", code); err != nil {
			t.Fatalf("%s: %v\n%s", tc.targets, err, out.String())
		}
		get := func(name string) int64 {
			v, _ := starlark.AsInt32(s.Get(name))
			return int64(v)
		}
		if got := get("TRAINABLE"); got != params {
			t.Errorf("%s: trainable %d, want %d", tc.targets, got, params)
		}
		if got := get("GRADS"); got != grads {
			t.Errorf("%s: gradients %d bytes, want %d", tc.targets, got, grads)
		}
		if got := get("FROZEN_GRADS"); got != 0 {
			t.Errorf("%s: %d frozen parameters have a gradient", tc.targets, got)
		}
		if got := get("STATE"); got != 2*grads {
			t.Errorf("%s: AdamW state %d bytes, want 2 × %d", tc.targets, got, grads)
		}
		s.Close()
	}
}
