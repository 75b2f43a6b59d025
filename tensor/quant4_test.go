package tensor_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
)

// TestQuantize4bitPacking: NF4 codes of one block with absmax 1 — 1 is
// code 15, -1 code 0, 0 code 7, 0.5 the nearest of 0.4407 (12) and
// 0.5626 (13): 12 — packed two per byte, the first in the high nibble.
func TestQuantize4bitPacking(t *testing.T) {
	c := newContext(t)
	w, err := tensor.FromFloat64s(c, []float64{1, -1, 0, 0.5, -0.3}, []int{1, 5}, tensor.Float32, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	packed, qs, err := tensor.Quantize4bit(w, 64, false, "nf4")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := packed.ToFloat64s()
	// -0.3 is nearest -0.2844 (code 4); the odd element's low nibble is 0
	want := []float64{15<<4 | 0, 7<<4 | 12, 4 << 4}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("packed %v, want %v", got, want)
	}
	if s := packed.Shape(); len(s) != 2 || s[0] != 3 || s[1] != 1 || packed.DType() != tensor.Uint8 {
		t.Errorf("packed shape %v %s, want [3 1] uint8", s, packed.DType())
	}
	am, _ := qs.Absmax.ToFloat64s()
	if len(am) != 1 || am[0] != 1 || qs.Nested() {
		t.Errorf("absmax %v nested %v, want [1] false", am, qs.Nested())
	}
	d, err := tensor.Dequantize4bit(packed, qs)
	if err != nil {
		t.Fatal(err)
	}
	dv, _ := d.ToFloat64s()
	for i, v := range []float64{1, -1, 0, 0.44070982933044434, -0.28444138169288635} {
		if math.Abs(dv[i]-v) > 1e-6 {
			t.Errorf("dequantized[%d] = %v, want %v", i, dv[i], v)
		}
	}
}

// TestQuantize4bitRoundTrip: a random weight, NF4 with double
// quantization: each dequantized value is within half NF4's widest gap
// (between -1 and -0.6962) of its block's absmax, plus the nested scales'
// error (the 8-bit dynamic map's, under 1 % of the absmax here).
func TestQuantize4bitRoundTrip(t *testing.T) {
	c := newContext(t)
	r := rand.New(rand.NewPCG(1, 2))
	n := 64 * 300
	vals := make([]float64, n)
	for i := range vals {
		vals[i] = r.NormFloat64() * 0.02
	}
	w, err := tensor.FromFloat64s(c, vals, []int{100, n / 100}, tensor.BFloat16, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	wv, _ := w.ToFloat64s()
	packed, qs, err := tensor.Quantize4bit(w, 64, true, "nf4")
	if err != nil {
		t.Fatal(err)
	}
	if !qs.Nested() || qs.DType != tensor.BFloat16 || qs.Blocks() != 300 {
		t.Fatalf("state: nested %v dtype %s blocks %d", qs.Nested(), qs.DType, qs.Blocks())
	}
	d, err := tensor.Dequantize4bit(packed, qs)
	if err != nil {
		t.Fatal(err)
	}
	if d.DType() != tensor.BFloat16 {
		t.Errorf("dequantized dtype %s, want bfloat16", d.DType())
	}
	dv, _ := d.ToFloat64s()
	for b := 0; b < 300; b++ {
		m := 0.0
		for _, v := range wv[b*64 : (b+1)*64] {
			m = math.Max(m, math.Abs(v))
		}
		for i := b * 64; i < (b+1)*64; i++ {
			if e := math.Abs(dv[i] - wv[i]); e > m*(0.5*(1-0.6961928009986877)+0.01) {
				t.Fatalf("element %d: %v dequantized to %v (block absmax %v)", i, wv[i], dv[i], m)
			}
		}
	}
}

// TestQuantize4bitBytes: what a 4-bit weight takes on a simulated GPU,
// exactly QuantStorageBytes (plus the shared dynamic map once), on a
// meta device (allocations only); the temporaries of quantization and
// dequantization are freed.
func TestQuantize4bitBytes(t *testing.T) {
	c := newSimContext(t, sim.Spec{Count: 1, Total: 1 << 30, Meta: true}, backend.PeakExact)
	gpu := c.Manager.GPU(0)
	for _, tc := range []struct {
		rows, cols int
		nested     bool
		want       int64
	}{
		{4096, 4096, true, 8388608 + 262144 + 4096 + 1024 + 512 + 512},
		{4096, 4096, false, 8388608 + 1048576 + 512},
		{3, 5, true, 512*5 + 1024},
		{11008, 4096, true, 22544384 + 704512 + 11264 + 1024 + 512 + 512},
	} {
		n := tc.rows * tc.cols
		if got := tensor.QuantStorageBytes(n, 64, tc.nested); got != tc.want {
			t.Errorf("QuantStorageBytes(%d, nested %v) = %d, want %d", n, tc.nested, got, tc.want)
		}
		c.Manager.Reclaim()
		before := int64(gpu.Allocated())
		w, err := tensor.Empty(c, []int{tc.rows, tc.cols}, tensor.BFloat16, "cuda")
		if err != nil {
			t.Fatal(err)
		}
		packed, qs, err := tensor.Quantize4bit(w, 64, tc.nested, "nf4")
		if err != nil {
			t.Fatal(err)
		}
		tensor.Dropped(w)
		w = nil
		// the state's tensors (what the reach walk meets) and the packed
		// weight are all the memory quantization left
		met := (packed.NBytes() + 511) / 512 * 512
		qs.EachTensor(func(t *tensor.Tensor) { met += (t.NBytes() + 511) / 512 * 512 })
		c.Manager.Reclaim()
		got := int64(gpu.Allocated()) - before
		want := tc.want
		if tc.nested {
			want += 1024 // the dynamic map, made by the first nested quantization and held by its states
		}
		if got != want {
			t.Errorf("%dx%d nested %v: %d bytes on the GPU, want %d", tc.rows, tc.cols, tc.nested, got, want)
		}
		if int64(met) != want {
			t.Errorf("%dx%d nested %v: the packed weight and the tensors EachTensor meets take %d bytes, want %d", tc.rows, tc.cols, tc.nested, met, want)
		}
		// dequantization's temporaries: the scales, freed once the weight exists
		d, err := tensor.Dequantize4bit(packed, qs)
		if err != nil {
			t.Fatal(err)
		}
		c.Manager.Reclaim()
		wb := (int64(d.Numel())*2 + 511) / 512 * 512
		if after := int64(gpu.Allocated()) - before; after != want+wb {
			t.Errorf("%dx%d: after dequantization %d, want %d + the weight %d", tc.rows, tc.cols, after, want, wb)
		}
		runtime.KeepAlive(packed)
		runtime.KeepAlive(qs)
		runtime.KeepAlive(d)
	}
}
