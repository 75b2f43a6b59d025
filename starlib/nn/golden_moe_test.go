package nn_test

// Golden cases of the Mixture-of-Experts ops: topk (and memsh's
// route_topk, compared with topk's figures: it allocates what topk
// allocates), advanced indexing with index tensors (IndexBackward0) and
// index_add (IndexAddBackward0). PyTorch 1.13 on the CPU allocates no
// temporaries in these backward nodes; CUDA's index_put_ with
// accumulate=True (IndexBackward0's backward) sorts the indices, but its
// temporaries are allocated only on simulated GPUs that model CUDA's own
// kernel allocations (presets: tensor.IndexBackward), not on this
// harness's sim:8GiB, so the CPU figures need no correction here.

func init() {
	const x4096x8 = "x = tensor.randn(4096, 8, device=\"cuda\", requires_grad=True)\ngo = tensor.ones(4096, 2, device=\"cuda\")\n"
	routeTopk := opCase("route_topk", x4096x8, "nn.functional.route_topk(x, 2).values", false)
	routeTopk.ref = "op_topk"
	addGolden(
		opCase("op_topk", x4096x8, "tensor.topk(x, 2, dim=-1).values", false),
		routeTopk,
		opCase("op_index_none_tensor",
			randn("x", "1024, 256", true)+"idx = tensor.randint(0, 1024, [96], device=\"cuda\")\ngo = tensor.ones(1, 96, 256, device=\"cuda\")\n",
			"x[None, idx]", false),
		opCase("op_index_pair_none",
			randn("w", "1024, 4", true)+"i0 = tensor.randint(0, 1024, [512], device=\"cuda\")\ni1 = tensor.randint(0, 4, [512], device=\"cuda\")\ngo = tensor.ones(512, 1, device=\"cuda\")\n",
			"w[i0, i1, None]", false),
		opCase("op_index_add",
			randn("z", "1024, 256", true)+"idx = tensor.randint(0, 1024, [96], device=\"cuda\")\n"+randn("src", "96, 256", true)+"go = tensor.ones(1024, 256, device=\"cuda\")\n",
			"tensor.index_add(z, 0, idx, src)", false),
		opCase("op_index_add_",
			"idx = tensor.randint(0, 1024, [96], device=\"cuda\")\n"+randn("src", "96, 256", true)+"go = tensor.ones(1024, 256, device=\"cuda\")\n",
			"tensor.zeros(1024, 256, device=\"cuda\").index_add_(0, idx, src)", false),
	)
}
