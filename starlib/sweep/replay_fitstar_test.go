package sweep_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
	"github.com/memsh/memsh/starlib/sweep"
)

// fitStarRun is one run of scripts/fit.star: each search's trials, by
// the search's name, in the order the searches ran.
type fitStarRun struct {
	names  []string
	trials map[string][]trialFigures
	out    string
}

// runFitStar runs scripts/fit.star with args on device, every
// sweep.max_fit with replay=replay, and returns each search's trials.
func runFitStar(t *testing.T, device string, replay bool, args ...string) *fitStarRun {
	t.Helper()
	src, err := os.ReadFile("../../scripts/fit.star")
	if err != nil {
		t.Fatal(err)
	}
	run := &fitStarRun{trials: map[string][]trialFigures{}}
	real := sweep.Module.Members["max_fit"].(*starlark.Builtin)
	maxFit := starlark.NewBuiltin("sweep.max_fit", func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		th.DeclareTransparent()
		var kw []starlark.Tuple
		name := ""
		for _, kv := range kwargs {
			switch kv[0] {
			case starlark.String("replay"):
				continue
			case starlark.String("name"):
				name = string(kv[1].(starlark.String))
			}
			kw = append(kw, kv)
		}
		kw = append(kw, starlark.Tuple{starlark.String("replay"), starlark.Bool(replay)})
		v, err := starlark.Call(th, real, args, kw)
		if err != nil {
			return nil, err
		}
		tv, _ := v.(*starlarkstruct.Struct).Attr("trials")
		run.trials[name] = trialsOf(t, tv)
		run.names = append(run.names, name)
		return v, nil
	})
	members := starlark.StringDict{}
	for k, v := range sweep.Module.Members {
		members[k] = v
	}
	members["max_fit"] = maxFit
	sw := &starlarkstruct.Module{Name: "sweep", Members: members}
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: device, Out: &out, Err: &out, Quiet: true, Library: scripts.Library,
		Argv: append([]string{}, args...), Builtins: starlark.StringDict{"sweep": sw}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec("../../scripts/fit.star", src); err != nil {
		t.Fatalf("fit.star %v: %v\n%s", args, err, out.String())
	}
	run.out = out.String()
	return run
}

// compareFitStar runs fit.star's searches with args in full and with
// replay and requires every trial of every search to be the same size
// with the same status, error and figures (peak allocated and reserved
// bytes to the byte). It returns how many trials there were and how many
// were replayed.
func compareFitStar(t *testing.T, device string, args ...string) (trials, replayed int) {
	t.Helper()
	restore := sweep.ShowReplayFields()
	defer restore()
	full := runFitStar(t, device, false, args...)
	rep := runFitStar(t, device, true, args...)
	if !slices.Equal(full.names, rep.names) {
		t.Fatalf("fit.star %v: searches in full %q, with replay %q", args, full.names, rep.names)
	}
	for _, name := range full.names {
		f, r := full.trials[name], rep.trials[name]
		if len(f) != len(r) {
			t.Errorf("%s: %d trials in full, %d with replay", name, len(f), len(r))
			continue
		}
		for i := range f {
			a, b := f[i], r[i]
			trials++
			if b.replayed {
				replayed++
			}
			if a.replayed {
				t.Errorf("%s: trial %d (%s) replayed without replay", name, i, a.params)
			}
			b.replayed = false
			if a != b {
				t.Errorf("%s: trial %d:\nfull   %+v\nreplay %+v", name, i, a, b)
			}
		}
	}
	if t.Failed() {
		t.Logf("full:\n%s\nreplay:\n%s", full.out, rep.out)
	}
	for _, line := range strings.Split(rep.out, "\n") {
		if strings.HasPrefix(line, "replay=True") {
			t.Log(line)
		}
	}
	return trials, replayed
}

// TestReplayEqualsFullTrialsFitStar: scripts/fit.star's searches (as
// memsh fit's: exact peak mode, fresh="search", replay) give the same
// trials, each with the same figures, run in full and with replay — here
// GPT-2 small's batch searches (full and LoRA) on the H100 preset; every
// search of the script's default run (its default models, every row,
// with and without checkpointing, batch and sequence) with -tags long
// (replay_long_test.go).
func TestReplayEqualsFullTrialsFitStar(t *testing.T) {
	if testing.Short() {
		t.Skip("searches")
	}
	trials, replayed := compareFitStar(t, "sim:H100,meta", "gpt2-small", "--what", "batch", "--checkpoint", "off")
	t.Logf("%d trials, %d replayed", trials, replayed)
	if replayed == 0 {
		t.Error("no trial was replayed: the test compares nothing")
	}
}

// trialsOf returns the figures of a sweep.max_fit result's trials.
func trialsOf(t *testing.T, tv starlark.Value) []trialFigures {
	t.Helper()
	var got []trialFigures
	it := starlark.Iterate(tv)
	defer it.Done()
	var x starlark.Value
	for it.Next(&x) {
		got = append(got, figuresOf(t, x.(*starlarkstruct.Struct)))
	}
	return got
}
