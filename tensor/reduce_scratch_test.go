package tensor

import "testing"

// The scratch of PyTorch's CUDA sum over the rows of a [R, C] gradient
// (a bias gradient), as torch 2.11 allocated it on an H100 (132
// multiprocessors of 2048 threads) in a GPT-2 small training step:
// testdata/torchref/cuda/h100_trace_b1_ckpt_cpp.jsonl.gz, the
// structured_sum_out allocations (staging, then semaphores).
func TestReduceScratch(t *testing.T) {
	for _, tc := range []struct {
		r, c, acc       int64
		staging, sem    int64
		sms, threadsPer int
	}{
		{1024, 768, 4, 6291456, 24, 132, 2048},   // c_proj and attention's c_proj bias
		{1024, 2304, 4, 18874368, 72, 132, 2048}, // c_attn bias
		{1024, 3072, 4, 25165824, 96, 132, 2048}, // c_fc bias
		{16, 768, 4, 0, 0, 132, 2048},            // few rows: one block per output, no global reduce
		{0, 768, 4, 0, 0, 132, 2048},
	} {
		s, m := reduceScratch(tc.r, tc.c, tc.acc, tc.sms, tc.threadsPer)
		if s != tc.staging || m != tc.sem {
			t.Errorf("reduceScratch(%d, %d) = %d, %d; want %d, %d", tc.r, tc.c, s, m, tc.staging, tc.sem)
		}
	}
}
