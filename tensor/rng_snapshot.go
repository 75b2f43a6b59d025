package tensor

// RNGSnapshot is the Philox generator's state (key and counter) at one
// moment: host state, no device memory. torch.utils.checkpoint stashes it
// in the forward (get_rng_state) and restores it for the recomputation so
// that random ops (dropout) draw the same values.
type RNGSnapshot struct{ seed, offset uint64 }

// SnapshotRNG returns the generator's current state (torch.get_rng_state).
func (c *Context) SnapshotRNG() RNGSnapshot {
	return RNGSnapshot{seed: c.rng.seed, offset: c.rng.offset}
}

// RestoreRNG makes the generator continue from s (torch.set_rng_state).
// Contexts sharing c's generator (staging) see it too.
func (c *Context) RestoreRNG(s RNGSnapshot) { c.rng.seed, c.rng.offset = s.seed, s.offset }
