// Cache-blocked 2-D strided copies (see kernels_copy.go): transposes and
// permutes whose source and destination are unit-stride along different
// dimensions. Copying tile by tile keeps both sides' cache lines in L1
// while they are used, instead of touching a new line of the strided side
// at every element.

#include <stdint.h>
#include <string.h>

// COPY_TILE is the tile edge in elements. Transposes of power-of-two
// widths put every line of a tile's strided side in the same L1 set, so
// a tile must not touch more lines than the cache has ways (8): 8×8 ran
// 4096² float32 in 14 ms, 16×16 in 20 ms, 32×32 in 69 ms, 64×64 in 32 ms
// (BenchmarkTransposeCopy, 2 cores of an AMD EPYC).
#define COPY_TILE 8

#define COPY2D(T)                                                                                 \
	for (int64_t i0 = 0; i0 < rows; i0 += COPY_TILE) {                                            \
		int64_t i1 = i0 + COPY_TILE < rows ? i0 + COPY_TILE : rows;                               \
		for (int64_t j0 = 0; j0 < cols; j0 += COPY_TILE) {                                        \
			int64_t j1 = j0 + COPY_TILE < cols ? j0 + COPY_TILE : cols;                           \
			for (int64_t i = i0; i < i1; i++) {                                                   \
				T *dp = d + i * dr;                                                               \
				const T *sp = s + i * sr;                                                         \
				for (int64_t j = j0; j < j1; j++) {                                               \
					dp[j * dc] = sp[j * sc];                                                      \
				}                                                                                 \
			}                                                                                     \
		}                                                                                         \
	}

// memsh_copy2d copies a rows×cols block of elem-byte elements (1, 2, 4 or
// 8) from s to d; strides are in elements (row, column) for each side.
void memsh_copy2d(int elem, void *dv, int64_t dr, int64_t dc, const void *sv, int64_t sr, int64_t sc, int64_t rows, int64_t cols) {
	switch (elem) {
	case 1: { uint8_t *d = dv; const uint8_t *s = sv; COPY2D(uint8_t) } break;
	case 2: { uint16_t *d = dv; const uint16_t *s = sv; COPY2D(uint16_t) } break;
	case 4: { uint32_t *d = dv; const uint32_t *s = sv; COPY2D(uint32_t) } break;
	case 8: { uint64_t *d = dv; const uint64_t *s = sv; COPY2D(uint64_t) } break;
	}
}
