// Package autograd is memsh's reverse-mode automatic differentiation, with
// PyTorch's semantics and PyTorch's memory behaviour: it records a graph of
// backward nodes as differentiable ops run, saves for each node exactly the
// tensors PyTorch's derivative formulas save (tools/autograd/derivatives.yaml
// and the composite decompositions of ATen), and runs the graph in PyTorch's
// engine order, releasing saved tensors and gradients at the points PyTorch
// releases them, so that every transient peak of a backward pass is the one
// PyTorch's CUDA caching allocator would see.
//
// The package sits above the tensor engine (package tensor: storage, ops,
// kernels, devices) and below the Starlark bindings (starlib/tensor,
// starlib/nn, starlib/optim); it knows nothing of Starlark.
//
// Pieces:
//   - meta.go: a tensor's autograd state (requires_grad, grad, grad_fn,
//     output_nr, retains_grad) kept in tensor.Tensor's AutogradMeta.
//   - node.go: backward nodes (Node) with their next edges and saved
//     tensors (SavedTensor, with PyTorch's version-counter check).
//   - engine.go: Backward — dependency counting, the ready queue ordered by
//     sequence number (AccumulateGrad first), input buffers with PyTorch's
//     in-place accumulation rule, AccumulateGrad's steal-or-copy rule,
//     sum_to for broadcast inputs, release of saved tensors unless
//     retain_graph.
//   - mode.go: grad mode (no_grad).
//   - ops_*.go: differentiable ops, each naming its PyTorch node
//     ("AddmmBackward0") and the derivatives.yaml entry it follows.
//
// Memory model: a tensor's storage is freed by the backend Manager's
// reclaim once nothing reaches it. Nodes drop their saved tensors and the
// engine drops each gradient at the moment PyTorch's reference counts would
// reach zero, so the Manager's exact-peak reclaim sees the same live set.
package autograd
