package nn_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/memsh/memsh/scope"
)

// TestKorthikantiActivations checks the activation memory of one GPT
// layer against Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models", eq. 1: a transformer layer
// in 16-bit with dropout keeps
//
//	s·b·h·(34 + 5·a·s/h) bytes
//
// for the backward (s sequence length, b batch, h hidden size, a heads).
// The layer is scripts/models/gpt2.star's block (nanoGPT's: pre-LN,
// fused c_attn, math attention with the registered causal mask, GELU
// MLP, dropout after the attention softmax, after attn.c_proj and after
// mlp.c_proj), bfloat16 parameters and input, training mode. memsh's
// figure — the bytes allocated after the forward, less the output (the
// next layer's input) plus the input (kept by ln_1) — is derived from
// the paper's formula plus named differences, exact to the byte.
//
// The paper's 34·sbh + 5·as²b, term by term, and the tensor memsh (as
// PyTorch 2.x on CUDA) keeps for each (2 bytes an element, masks 1):
//
//	2sbh   QKV input                ln_1's output, saved by c_attn (addmm)
//	4sbh   QKᵀ inputs               q and kᵀ: matmul's expand+reshape of the
//	                                transposed views copies them (contiguous
//	                                [b·a, s, h/a] and [b·a, h/a, s]), BmmBackward0
//	                                saves the copies; the fused qkv output (6sbh)
//	                                itself is freed (split keeps no reference)
//	2as²b  softmax output           SoftmaxBackward0's result
//	as²b   softmax dropout mask     NativeDropoutBackward0's bool mask (1 byte, as
//	                                the paper's byte mask); the scaled scores and
//	                                the masked_fill output are not kept (the ·scale
//	                                saves only its Python scalar, a CPU wrapped
//	                                number: no device memory)
//	2as²b  attention over V         the dropout output, saved by the second bmm
//	2sbh   … and V                  v's contiguous copy (same reshape as q, k)
//	sbh    output dropout mask      resid_dropout's bool mask; its output is not
//	                                kept (add saves nothing)
//	2sbh   linear projection input  y.transpose(1, 2).contiguous(), saved by c_proj
//	2sbh   MLP input                ln_2's output, saved by c_fc
//	8sbh   GeLU input               c_fc's output, saved by GeluBackward0
//	8sbh   second linear input      the GELU output, saved by mlp.c_proj
//	sbh    MLP dropout mask         mlp.dropout's bool mask
//	4sbh   2 LayerNorm inputs       x (kept by ln_1) and x + attn (kept by ln_2)
//
// What the paper does not count, and memsh (PyTorch) keeps:
//
//	16bs   LayerNorm statistics: NativeLayerNormBackward0 saves mean and rstd,
//	       [b, s, 1] float32 each (the accumulate type of bfloat16), for
//	       ln_1 and ln_2: 2 × 2 × 4·b·s bytes
//	s²     the causal mask: nanoGPT's masked_fill(bias[:, :, :s, :s] == 0,
//	       -inf) saves the bool [1, 1, s, s] result of == 0 for
//	       MaskedFillBackward0 (one per layer, not per batch or head)
//	round  the caching allocator rounds each block up to 512 bytes; the
//	       configurations whose sizes are all multiples of 512 have none,
//	       the others get Σ (kround512(t) − t) over the kept tensors
//
// (The other usual differences are absent here: PyTorch keeps dropout's
// output only where the next op saves it — bmm does, add does not — the
// same as the paper's accounting; masks are bool, one byte like the
// paper's; matmul's copies of q, k, v cost what the paper charges for
// the views; GELU saves its input as the paper assumes.)
func TestKorthikantiActivations(t *testing.T) {
	for _, c := range []struct{ s, b, h, a int64 }{
		{128, 2, 256, 4},   // every tensor a multiple of 512 bytes
		{256, 4, 512, 8},   // idem
		{64, 2, 768, 12},   // GPT-2 small's width and heads
		{100, 3, 96, 3},    // unaligned: the allocator's rounding shows
		{512, 1, 1600, 25}, // GPT-2 XL's width and heads
	} {
		t.Run(fmt.Sprintf("s%d_b%d_h%d_a%d", c.s, c.b, c.h, c.a), func(t *testing.T) {
			s, b, h, a := c.s, c.b, c.h, c.a
			sbh, as2b := s*b*h, a*s*s*b
			paper := 34*sbh + 5*as2b // s·b·h·(34 + 5·a·s/h), kept an integer
			// The kept tensors, the paper's terms first, then memsh's extra
			// ones; each is one allocation.
			type term struct {
				what  string
				bytes int64
				paper bool
			}
			terms := []term{
				{"QKV input (ln_1 output)", 2 * sbh, true},
				{"QKᵀ input q (contiguous copy)", 2 * sbh, true},
				{"QKᵀ input kᵀ (contiguous copy)", 2 * sbh, true},
				{"softmax output", 2 * as2b, true},
				{"softmax dropout mask", as2b, true},
				{"attention over V: dropout output", 2 * as2b, true},
				{"attention over V: v (contiguous copy)", 2 * sbh, true},
				{"output dropout mask", sbh, true},
				{"linear projection input", 2 * sbh, true},
				{"MLP input (ln_2 output)", 2 * sbh, true},
				{"GeLU input", 8 * sbh, true},
				{"second linear input", 8 * sbh, true},
				{"MLP dropout mask", sbh, true},
				{"LayerNorm input x", 2 * sbh, true},
				{"LayerNorm input x + attn", 2 * sbh, true},
				{"ln_1 mean", 4 * b * s, false},
				{"ln_1 rstd", 4 * b * s, false},
				{"ln_2 mean", 4 * b * s, false},
				{"ln_2 rstd", 4 * b * s, false},
				{"causal mask (bias == 0)", s * s, false},
			}
			var paperSum, extra, rounding int64
			for _, tm := range terms {
				if tm.paper {
					paperSum += tm.bytes
				} else {
					extra += tm.bytes
				}
				rounding += kround512(tm.bytes) - tm.bytes
			}
			if paperSum != paper {
				t.Fatalf("the paper's terms sum to %d, its formula gives %d", paperSum, paper)
			}
			lnStats, causal := 16*b*s, s*s
			if extra != lnStats+causal {
				t.Fatalf("extra terms %d, want LayerNorm statistics %d + causal mask %d", extra, lnStats, causal)
			}
			want := paper + lnStats + causal + rounding

			got := korthikantiKept(t, s, b, h, a)
			t.Logf("s=%d b=%d h=%d a=%d: paper %d + LayerNorm statistics %d + causal mask %d + rounding %d = %d; memsh %d",
				s, b, h, a, paper, lnStats, causal, rounding, want, got)
			if got != want {
				t.Errorf("memsh keeps %d bytes after the forward, want %d (paper %d + LayerNorm statistics %d + causal mask %d + rounding %d): off by %d",
					got, want, paper, lnStats, causal, rounding, got-want)
			}
		})
	}
}

func kround512(n int64) int64 { return (n + 511) / 512 * 512 }

// korthikantiKept runs one gpt2.star block forward on a meta simulator and
// returns the bytes it keeps: allocated after the forward − before − the
// output + the input (ln_1 keeps it; it was allocated before).
func korthikantiKept(t *testing.T, s, b, h, a int64) int64 {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "scripts", "models"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sess, err := scope.New(scope.Options{Device: "sim:16GiB,meta", Out: &out, Err: &out, Quiet: true, LoadPath: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	setup := fmt.Sprintf(`
load("gpt2.star", "gpt2")
model = gpt2(n_layer = 1, n_head = %d, n_embd = %d, vocab_size = 64, block_size = %d, dropout = 0.1, device = "cuda", dtype = "bfloat16")
block = model.h[0]
x = tensor.randn([%d, %d, %d], device = "cuda", dtype = tensor.bfloat16)
x.requires_grad_()
`, a, h, s, b, s, h)
	if err := sess.Exec("setup.star", setup); err != nil {
		t.Fatalf("setup: %v\n%s", err, out.String())
	}
	mgr := sess.Manager()
	gpu := mgr.GPU(0)
	measure := func() int64 {
		mgr.Reclaim()
		return int64(gpu.Allocated())
	}
	before := measure()
	if err := sess.Exec("forward.star", "y = block(x)\nif y.dtype != tensor.bfloat16:\n    fail(y.dtype)"); err != nil {
		t.Fatalf("forward: %v\n%s", err, out.String())
	}
	after := measure()
	output := kround512(2 * s * b * h) // y, bfloat16 [b, s, h]: the next layer's input
	input := kround512(2 * s * b * h)  // x, allocated before, kept by ln_1
	return after - before - output + input
}
