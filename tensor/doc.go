// Package tensor is memsh's tensor engine: PyTorch-style tensors whose
// every byte lives in memory owned by a backend.Manager (device memory of
// a GPU or the simulator, or C-heap memory for "cpu"), so that memory
// experiments account for it exactly. It is to memsh what ATen is to
// PyTorch; the Starlark binding (starlib/tensor) sits above it. The
// package knows nothing of Starlark, of Sessions or of env: everything a
// Session provides comes in a *Context (NewContext: the Manager, the
// Philox generator's state, the default device).
//
// What it owns:
//   - DType (dtype.go): the dtypes, their sizes, PromoteTypes, CanCast and
//     PyTorch's result-type rules with wrapped numbers (Scalar).
//   - Storage (storage.go): one *backend.Memory shared by a tensor and all
//     its views, with the version counter that in-place writes bump.
//   - Tensor (tensor.go): storage, dtype, shape, strides (in elements),
//     offset, view flag and Context; its Binding field is the binding
//     layer's. Tensors keep nothing alive but their Storage: the Manager
//     frees a Memory at its next reclaim once no tensor refers to it.
//   - the ops, as Go functions returning (*Tensor, error):
//     creation (create.go: Empty, Zeros, Ones, Full, Rand, Randn, Arange,
//     FromScalars, FromFloat64s, the *Like forms), arithmetic (arith.go:
//     Add, Sub, Mul, Div, FloorDivide, Remainder over Operands — a
//     *Tensor or a Scalar — with BinaryOut for out= and the in-place
//     methods Add_, Sub_, Mul_, Div_, Fill_, Zero_, Copy_; the unary
//     Neg, Abs, Relu, Exp, Log, Sqrt, Tanh, Sigmoid), comparisons
//     (compare.go: Eq ... Ge, Equal, Allclose), reductions (reduce.go:
//     Sum, Mean, Max, Min, MaxDim, MinDim), Matmul and MatmulOut
//     (matmul.go), views and copies (views.go: View, Reshape, Flatten,
//     Transpose, T, ReverseDims, Permute, Expand, Narrow, Select,
//     Squeeze, Unsqueeze, Index, Slice0, Contiguous, Clone, To, Cat,
//     Stack), reading values (values.go: Item, Values, ToFloat64s,
//     Contains) and printing (format.go: Tensor.String);
//   - the CPU kernels (kernels*.go, kernels_simd.c: AVX-512/AVX2/SSE2
//     loops chosen at load time; blas.go: OpenBLAS loaded at run time, or
//     gonum) and the real-GPU dispatch (gpu_*.go).
//
// Conventions. Sizes are in bytes, strides and offsets in elements; every
// allocating op allocates exactly its result (numel × itemsize bytes),
// checked before anything is allocated (more than 2^62 bytes is an error;
// an out-of-memory error from the Manager is wrapped, so backend.IsOOM
// recognises it). Views and in-place ops allocate nothing. Names ending
// in "_" are in place: they write into the receiver, bump its Storage's
// version and return it. Functions ending in "Out" write into a given
// tensor. DType Undefined and device "" mean "the default" (float32 or
// the input's dtype; the Context's default device or the input's device).
// Negative dims count from the end.
//
// Errors are *Error values worded as PyTorch's and prefixed with the op's
// name as the binding calls it: "tensor.add: the size of tensor a (2)
// must match the size of tensor b (3) at non-singleton dimension 1". A
// binding exposing an op under another name renames it (Renamed).
// Released memory (backend.Manager.Release) makes every op on the tensor
// fail with the release reason.
//
// Meta devices (a simulated GPU in meta mode) store no values: every op
// allocates exactly what it would with data, and what needs values
// (Item, Values, Equal, Allclose, Contains) fails with "device cuda:0 is
// meta: values are not stored".
//
// Real GPUs (backend/cuda): every op that touches values decides inside
// the engine: a native kernel where there is one (gpu_native.go), else
// the CPU implementation on host shadows of the GPU operands whose
// results are uploaded back (gpu_stage.go), with the same device
// allocations as a GPU implementation. See gpu_dispatch.go.
package tensor
