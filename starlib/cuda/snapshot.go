package cuda

import (
	"fmt"
	"io"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/snapshot"
)

// historyKey is the per-session snapshot.Recorder's key in env.Env.Values.
const historyKey = "cuda.memory_history"

func history(thread *starlark.Thread, b *starlark.Builtin) (*snapshot.Recorder, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if e.Manager.NumGPUs() == 0 {
		return nil, fmt.Errorf("%s: no CUDA devices available", b.Name())
	}
	if r, ok := e.Values[historyKey].(*snapshot.Recorder); ok {
		return r, nil
	}
	r := snapshot.New(e.Manager)
	e.Values[historyKey] = r
	if e.Session != nil {
		// Frees are recorded at the end of the statement that made the
		// garbage at the latest (see package snapshot).
		e.Session.OnStatement(func(ev env.StatementEvent) {
			if !ev.Start {
				r.StatementEnd(ev.Pos)
			}
		})
	}
	return r, nil
}

// cuda.record_memory_history(enabled=True, max_entries=100000), as
// torch.cuda.memory._record_memory_history: with enabled True (or "all")
// every later allocation, free, segment allocation and release, and
// out-of-memory error of each GPU is recorded with the Starlark call stack
// that caused it, keeping the last max_entries events per GPU; the frames
// of live blocks are kept too. Enabling again starts a fresh history.
// With enabled False or None recording stops; what was recorded stays
// for cuda.dump_snapshot.
func recordMemoryHistory(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var enabled starlark.Value = starlark.True
	maxEntries := snapshot.DefaultMaxEntries
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "enabled?", &enabled, "max_entries?", &maxEntries); err != nil {
		return nil, err
	}
	var on bool
	switch v := enabled.(type) {
	case starlark.Bool:
		on = bool(v)
	case starlark.NoneType:
	case starlark.String:
		if v != "all" {
			return nil, fmt.Errorf("%s: for parameter enabled: got %s, want True, False, None or \"all\"", b.Name(), v)
		}
		on = true
	default:
		return nil, fmt.Errorf("%s: for parameter enabled: got %s, want bool or None", b.Name(), enabled.Type())
	}
	if maxEntries < 1 {
		return nil, fmt.Errorf("%s: for parameter max_entries: got %d, want an int >= 1", b.Name(), maxEntries)
	}
	r, err := history(thread, b)
	if err != nil {
		return nil, err
	}
	if on {
		r.Enable(thread, maxEntries)
	} else {
		r.Disable()
	}
	return starlark.None, nil
}

// cuda.dump_snapshot(path, overwrite=False), as
// torch.cuda.memory._dump_snapshot: reclaims first, so the segments show
// the live set a reference-counted run would have (no garbage awaiting a
// GC), then writes the allocator state of every GPU (segments and their
// blocks) and the recorded history (device_traces) as a protocol 2 pickle
// that pytorch.org/memory_viz opens. See package snapshot for the
// structure. The file is written whole or not at all, only under the
// working directory or --out-dir (the session's env.Env.Files), and
// replaces an existing file only if that is a snapshot too, unless
// overwrite is True.
func dumpSnapshot(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var path string
	var overwrite bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "path", &path, "overwrite?", &overwrite); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, fmt.Errorf("%s: for parameter path: empty path", b.Name())
	}
	r, err := history(thread, b)
	if err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	e.Manager.Reclaim()
	if err := e.Files.WriteFile(path, fsafe.Snapshot, overwrite, func(w io.Writer) error {
		return snapshot.Pickle(w, r.Snapshot())
	}); err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlark.None, nil
}
