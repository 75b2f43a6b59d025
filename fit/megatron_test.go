package fit_test

// Megatron-LM's theoretical memory (megatron/training/
// theoretical_memory_usage.py), paraphrased for the configurations it
// covers that memsh models: a dense GPT/Llama decoder (no MoE, no
// multi-latent attention, no MTP), one pipeline stage. memsh's figures
// for the same model under tensor parallelism differ as the test below
// states.

// megatronConfig is the arguments theoretical_memory_usage reads.
type megatronConfig struct {
	layers, hidden, ffn, heads, groups, kvChannels int
	vocab                                          int // padded_vocab_size
	swiglu, rmsNorm, untied                        bool
	tp, dp                                         int
	distributedOptimizer                           bool
	seq, microBatch                                int
}

// megatronShardParameters is compute_weight_and_optimizer_memory's
// num_parameters_on_most_loaded_model_shard (pipeline size 1).
func megatronShardParameters(c megatronConfig) float64 {
	gated := 1.0
	if c.swiglu {
		gated = 1.5
	}
	norm := 2.0
	if c.rmsNorm {
		norm = 1
	}
	h := float64(c.hidden)
	qRatio := float64(c.kvChannels*c.heads) / h
	attn := 2 * h * h * ((1 + float64(c.groups)/float64(c.heads)) * qRatio)
	layer := 2*h*(float64(c.ffn)*gated+norm) + attn
	block := layer*float64(c.layers) + norm*h
	emb := h * float64(c.vocab)
	shard := (block + emb) / float64(c.tp)
	if c.untied {
		shard += emb / float64(c.tp)
	}
	return shard
}

// megatronBytesPerParameter is its num_bytes_per_parameter: bf16
// weights, fp32 main gradients, fp32 master weights and Adam's two
// moments (18), or with the distributed optimizer the last 12 sharded
// over the data-parallel ranks.
func megatronBytesPerParameter(c megatronConfig) float64 {
	if c.distributedOptimizer {
		return 6 + 12/float64(c.dp)
	}
	return 18
}

// megatronActivations is compute_activation_memory (sequence parallelism
// with selective recomputation: Korthikanti et al., Table 2), one
// pipeline stage: s·b·h·(18 + 4·ffn/h) per layer, the embedding's input
// and dropout, the output layer's input and fp32 logits, all over tp.
func megatronActivations(c megatronConfig) float64 {
	sbh := float64(c.seq * c.microBatch * c.hidden)
	act := sbh * (18 + 4*float64(c.ffn)/float64(c.hidden)) * float64(c.layers)
	act += 8 * float64(c.seq*c.microBatch)
	act += sbh
	act += sbh * 4 * (1 + float64(c.vocab)/float64(c.hidden))
	return act / float64(c.tp)
}
