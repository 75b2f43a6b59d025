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
	)
}
