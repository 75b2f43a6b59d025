package tensor_test

import (
	"slices"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
)

// TestLayerNormBackwardTileSums: the memory of the CUDA layer norm
// backward over many short rows, as torch 2.11 allocated it on an H100 in
// GPT-2 small's backward at batch 122 (M = 124,928 rows of N = 768,
// h100_trace_b122_ckpt_cpp.jsonl.gz, NativeLayerNormBackward0): grad
// input, weight and bias gradients, then two [1365, 768] float32 per-tile
// sums (⌈768/32⌉ = 24 column blocks, min(⌈M/32⌉, 32768/24) = 1365 row
// blocks), each summed over its rows into a new gradient with the reduce
// kernel's 8,650,752-byte staging and semaphores, replacing the gradient
// made first; the per-tile sums freed last. With fewer rows (65,536 or
// less) none of it.
func TestLayerNormBackwardTileSums(t *testing.T) {
	sp, err := sim.ParseSpec("H100,meta")
	if err != nil {
		t.Fatal(err)
	}
	c := newSimContext(t, sp, backend.PeakLazy)
	m := c.Manager
	for _, rows := range []int{124928, 65536} {
		x, err := tensor.Empty(c, []int{rows, 768}, tensor.Float32, "cuda")
		if err != nil {
			t.Fatal(err)
		}
		w, _ := tensor.Empty(c, []int{768}, tensor.Float32, "cuda")
		b, _ := tensor.Empty(c, []int{768}, tensor.Float32, "cuda")
		_, mean, rstd, err := tensor.NativeLayerNorm(x, []int{768}, w, b, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := tensor.Empty(c, []int{rows, 768}, tensor.Float32, "cuda")
		var got []int64 // requested bytes: + allocated, - freed
		stop := m.Observe(func(e backend.Event) {
			switch e.Kind {
			case backend.EventAlloc:
				got = append(got, int64(e.Requested))
			case backend.EventFree:
				got = append(got, -int64(e.Requested))
			}
		})
		_, _, _, err = tensor.NativeLayerNormBackward(g, x, []int{768}, mean, rstd, w, b, [3]bool{true, true, true})
		stop()
		if err != nil {
			t.Fatal(err)
		}
		gx := int64(rows * 768 * 4)
		want := []int64{gx, 3072, 3072}
		if rows > 65536 {
			want = append(want,
				4193280, 4193280, // per-tile sums of the weight's and the bias's gradient
				3072, 8650752, 24, -24, -8650752, -3072, // weight: sum(0), its staging; the first gradient freed
				3072, 8650752, 24, -24, -8650752, -3072, // bias
				-4193280, -4193280)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%d rows: allocations and frees %v, want %v", rows, got, want)
		}
	}
}
