package tensor

import (
	"fmt"
	"testing"
	"unsafe"
)

// transposeLayouts returns the dst (contiguous) and src (x.t() of a
// contiguous r×c buffer) layouts of x.t().contiguous().
func transposeLayouts(dst, src unsafe.Pointer, size, r, c int) (strided, strided) {
	return strided{base: dst, size: size, st: []int{r, 1}}, strided{base: src, size: size, st: []int{1, c}}
}

func BenchmarkTransposeCopy(b *testing.B) {
	for _, n := range []int{1024, 4096} {
		b.Run(fmt.Sprintf("f32/%d", n), func(b *testing.B) {
			src, dst := make([]float32, n*n), make([]float32, n*n)
			d, s := transposeLayouts(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), 4, n, n)
			b.SetBytes(int64(8 * n * n))
			for b.Loop() {
				copyKernel(d, Float32, s, Float32, []int{n, n})
			}
		})
	}
}

// TestCopyTiled checks blocked copies against element-by-element index
// arithmetic: 2-D and batched transposes, permutes, offsets, sizes that
// are not multiples of the tile, every element size, and the destination
// strided instead of the source.
func TestCopyTiled(t *testing.T) {
	for _, size := range []int{1, 2, 4, 8} {
		for _, c := range []struct {
			shape      []int
			dst, src   []int // strides over shape
			doff, soff int
		}{
			{[]int{37, 53}, []int{53, 1}, []int{1, 37}, 0, 0},
			{[]int{64, 64}, []int{64, 1}, []int{1, 64}, 0, 0},
			{[]int{130, 17}, []int{17, 1}, []int{1, 131}, 0, 3},
			{[]int{3, 40, 33}, []int{40 * 33, 33, 1}, []int{40 * 33, 1, 40}, 0, 0},                           // batched transpose
			{[]int{2, 20, 3, 18}, []int{20 * 3 * 18, 3 * 18, 18, 1}, []int{18 * 20 * 3, 3, 1, 20 * 3}, 0, 0}, // NCHW -> NHWC-like
			{[]int{33, 65}, []int{1, 33}, []int{65, 1}, 5, 0},                                                // into a transposed view
			{[]int{16, 16}, []int{16, 1}, []int{1, 16}, 0, 0},
		} {
			n, span := 1, 1
			for d, s := range c.shape {
				n *= s
				span += (s - 1) * max(c.src[d], c.dst[d])
			}
			span += max(c.doff, c.soff)
			src := make([]byte, span*size)
			for i := range src {
				src[i] = byte(i*7 + i/251)
			}
			got, want := make([]byte, span*size), make([]byte, span*size)
			d := strided{base: unsafe.Pointer(&got[0]), size: size, off: c.doff, st: c.dst}
			s := strided{base: unsafe.Pointer(&src[0]), size: size, off: c.soff, st: c.src}
			it := newElemIter(c.shape, d, s)
			if !copyTiled(it, size) {
				t.Fatalf("size %d shape %v: not tiled", size, c.shape)
			}
			idx := make([]int, len(c.shape))
			for range n {
				do, so := c.doff, c.soff
				for k, i := range idx {
					do += i * c.dst[k]
					so += i * c.src[k]
				}
				copy(want[do*size:(do+1)*size], src[so*size:(so+1)*size])
				for k := len(idx) - 1; k >= 0; k-- {
					if idx[k]++; idx[k] < c.shape[k] {
						break
					}
					idx[k] = 0
				}
			}
			if string(got) != string(want) {
				t.Errorf("size %d shape %v dst %v src %v: wrong copy", size, c.shape, c.dst, c.src)
			}
		}
	}
}
