//go:build long

package sweep_test

import "testing"

// TestLongReplayEqualsFullTrialsFitStar runs every search of
// scripts/fit.star for one model of each kind (GPT-2 small, Qwen2.5 0.5B,
// ResNet-18), every row (full, LoRA, QLoRA, inference), with and without
// checkpointing, batch and sequence (--what both) — on
// the H100 preset in full and with replay, and compares every trial
// (TestReplayEqualsFullTrialsFitStar does a part of it in the default
// suite). .ci/run's long step: go test -tags long.
func TestLongReplayEqualsFullTrialsFitStar(t *testing.T) {
	trials, replayed := compareFitStar(t, "sim:H100,meta", "gpt2-small", "qwen2.5-0.5b", "resnet18", "--what", "both")
	t.Logf("%d trials, %d replayed", trials, replayed)
	if replayed == 0 {
		t.Error("no trial was replayed: the test compares nothing")
	}
}

// TestLongReplayRandomModels is TestReplayRandomModels over 40 seeds.
func TestLongReplayRandomModels(t *testing.T) {
	checkRandomModels(t, 1, 40)
}
