package nn_test

// Golden cases of the losses and the indexing ops (cross_entropy,
// mse_loss, embedding, masked_fill, where, index_select).

func init() {
	addGolden(
		// Same on CPU and CUDA (bench/torchref/README.md item 8).
		opCase("op_cross_entropy", randn("x", "64, 10", true)+"y = tensor.randint(0, 10, [64], device=\"cuda\")\n",
			"nn.functional.cross_entropy(x, y)", true),
		// The 0-dim loss keeps its input-sized storage in PyTorch 2.x too
		// (the structured meta function allocates the output at the
		// input's shape and resize_({})s it; pytorch/pytorch#185647 shows
		// it with 2.9), and the CUDA mean reduces without the CPU's
		// sum_out + div_ (whose only extra tensors are host scalars,
		// already left out): no correction.
		opCase("op_mse_loss", randn("x", "64, 1024", true)+randn("t", "64, 1024", false),
			"nn.functional.mse_loss(x, t)", true),
		// CUDA's embedding_dense_backward takes the feature kernel for at
		// most 3072 indices (here 256) and allocates only the zero-filled
		// dense gradient, as the CPU does (Embedding.cu,
		// embedding_dense_backward_cuda): no correction.
		opCase("op_embedding", "idx = tensor.randint(0, 512, [4, 64], device=\"cuda\")\n"+randn("w", "512, 128", true)+
			"go = tensor.ones(4, 64, 128, device=\"cuda\")\n", "nn.functional.embedding(idx, w)", false),
		// The mask's == 0 makes a host wrapped scalar on CPU (left out):
		// the bool mask (4,096) is the only other forward allocation.
		opCase("op_masked_fill", randn("x", "4, 4, 64, 64", true)+
			"mask = tensor.ones(64, 64, device=\"cuda\").tril().view(1, 1, 64, 64)\ngo = tensor.ones(4, 4, 64, 64, device=\"cuda\")\n",
			"x.masked_fill(mask.eq(0), float(\"-inf\"))", false),
		opCase("op_where", "c = tensor.randn(64, 1024, device=\"cuda\").gt(0)\n"+randn("x", "64, 1024", true)+randn("y", "64, 1024", true)+go64x1024,
			"tensor.where(c, x, y)", false),
		opCase("op_index_select", randn("x", "1024, 256", true)+"idx = tensor.randint(0, 1024, [64], device=\"cuda\")\ngo = tensor.ones(64, 256, device=\"cuda\")\n",
			"tensor.index_select(x, 0, idx)", false),
	)
}
