package cuda_test

import "flag"

// realGPU makes the benchmarks use the real driver ($MEMSH_LIBCUDA or
// libcuda.so.1) instead of the stub.
var realGPU = flag.Bool("gpu", false, "benchmark the real CUDA driver instead of the stub")
