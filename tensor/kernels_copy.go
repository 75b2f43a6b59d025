package tensor

/*
#include <stdint.h>
void memsh_copy2d(int elem, void *d, int64_t dr, int64_t dc, const void *s, int64_t sr, int64_t sc, int64_t rows, int64_t cols);
*/
import "C"

import "unsafe"

// Blocked copies for transposes (kernels_copy.c). A same-dtype copy whose
// coalesced iteration has the destination unit-stride along one of the
// two innermost dimensions and the source along the other (x.t(),
// batched transposes, NCHW↔NHWC permutes) is copied in 8×8 tiles;
// every other copy takes copyKernel's run-by-run loop.

// tiledMin is the smallest inner extent (both innermost dimensions) that
// copyTiled takes on: below it runs are short and the loop is cheap.
const tiledMin = 16

// tiledBand is the number of rows of one parallel work item.
const tiledBand = 64

// copyTiled copies src into dst (iteration it, same dtype of size bytes)
// in tiles and reports true, or reports false without copying when the
// layout is not a transpose.
func copyTiled(it *elemIter, size int) bool {
	nd := len(it.shape)
	if nd < 2 || (size != 1 && size != 2 && size != 4 && size != 8) {
		return false
	}
	d, s := it.ops[0], it.ops[1]
	rows, cols := it.shape[nd-2], it.shape[nd-1]
	if rows < tiledMin || cols < tiledMin {
		return false
	}
	if !(d.st[nd-1] == 1 && s.st[nd-2] == 1) && !(d.st[nd-2] == 1 && s.st[nd-1] == 1) {
		return false
	}
	outer := 1
	for _, x := range it.shape[:nd-2] {
		outer *= x
	}
	bands := (rows + tiledBand - 1) / tiledBand
	work := outer * bands
	threshold := max(1, parallelThreshold/(tiledBand*cols))
	parallelForStop(it.stop, work, threshold, max(1, interruptGrain/(tiledBand*cols)), func(lo, hi int) {
		for w := lo; w < hi; w++ {
			o, band := w/bands, w%bands
			doff, soff := d.off, s.off
			for k := nd - 3; k >= 0; k-- {
				i := o % it.shape[k]
				o /= it.shape[k]
				doff += i * d.st[k]
				soff += i * s.st[k]
			}
			r0 := band * tiledBand
			r := min(tiledBand, rows-r0)
			doff += r0 * d.st[nd-2]
			soff += r0 * s.st[nd-2]
			C.memsh_copy2d(C.int(size),
				unsafe.Add(d.base, doff*size), C.int64_t(d.st[nd-2]), C.int64_t(d.st[nd-1]),
				unsafe.Add(s.base, soff*size), C.int64_t(s.st[nd-2]), C.int64_t(s.st[nd-1]),
				C.int64_t(r), C.int64_t(cols))
		}
	})
	return true
}
