package snapshot_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/snapshot"
)

func simManager(t testing.TB) *backend.Manager {
	t.Helper()
	sp, err := sim.ParseSpec("1GiB")
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.New(sp)[0]
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(dev, 0)}, Host: host.NewAllocator()})
	t.Cleanup(m.Close)
	return m
}

func get(d snapshot.Dict, key string) any {
	for _, it := range d {
		if it.Key == key {
			return it.Value
		}
	}
	return nil
}

// The history is a ring of max_entries entries per device: the newest
// are kept.
func TestHistoryRing(t *testing.T) {
	m := simManager(t)
	r := snapshot.New(m)
	r.Enable(nil, 10)
	var live []*backend.Memory
	for i := 1; i <= 40; i++ {
		h, err := m.Alloc("cuda:0", uint64(i)*512)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, h)
	}
	snap := r.Snapshot()
	traces := get(snap, "device_traces").([]any)
	tr := traces[0].([]any)
	if len(tr) != 10 {
		t.Fatalf("%d entries, want the last 10", len(tr))
	}
	var sizes []uint64
	for _, e := range tr {
		d := e.(snapshot.Dict)
		if get(d, "action") != "alloc" {
			t.Fatalf("entry %v", d)
		}
		sizes = append(sizes, get(d, "size").(uint64))
	}
	want := []uint64{31 * 512, 32 * 512, 33 * 512, 34 * 512, 35 * 512, 36 * 512, 37 * 512, 38 * 512, 39 * 512, 40 * 512}
	if !reflect.DeepEqual(sizes, want) {
		t.Errorf("sizes %v, want %v", sizes, want)
	}
	r.Disable()
	if _, err := m.Alloc("cuda:0", 4096); err != nil {
		t.Fatal(err)
	}
	if n := len(get(r.Snapshot(), "device_traces").([]any)[0].([]any)); n != 10 {
		t.Errorf("after Disable the history changed: %d entries", n)
	}
	// segments tile with their blocks
	for _, s := range get(snap, "segments").([]any) {
		seg := s.(snapshot.Dict)
		var sum uint64
		addr := get(seg, "address").(uint64)
		for _, b := range get(seg, "blocks").([]any) {
			blk := b.(snapshot.Dict)
			if get(blk, "address").(uint64) != addr+sum {
				t.Errorf("block at %#x, want %#x", get(blk, "address"), addr+sum)
			}
			sum += get(blk, "size").(uint64)
		}
		if sum != get(seg, "total_size").(uint64) {
			t.Errorf("blocks add up to %d, segment is %d", sum, get(seg, "total_size"))
		}
	}
	_ = live
}

const script = `cuda.record_memory_history()
a = tensor.zeros([1024, 1024], device="cuda")
def make():
    return cuda.malloc(30 * MiB)
b = make()
small = cuda.malloc(1000)
d = cuda.malloc(40 * MiB)
d = None
gc()
cuda.empty_cache()
def oom():
    return cuda.malloc(2 * GiB)
r = trial(oom)
cuda.dump_snapshot(PATH)
`

// The snapshot loads with Python's pickle and has PyTorch's keys, and only
// uses the opcodes memory_viz's own unpickler reads.
func TestSnapshotLoadsInPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: skipping the check that Python's pickle loads the snapshot")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "job.star")
	pickle := filepath.Join(dir, "snap.pickle")
	if err := os.WriteFile(src, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Env().Files = &fsafe.Policy{Roots: []string{dir}} // as --out-dir DIR
	if err := s.Exec("setup", fmt.Sprintf("PATH = %q", pickle)); err != nil {
		t.Fatal(err)
	}
	if err := s.Exec(src, nil); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command(py, "-c", checkPy, pickle).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, res)
	}
	var got struct {
		Top, SegKeys, BlockKeys, EntryKeys, OOMKeys, Actions, Opcodes, States []string
		Tiled                                                                 bool
		MakeFrames, BlockFrames                                               []map[string]any
		OOMSize, OOMFree                                                      int64
		Devices                                                               int
	}
	if err := json.Unmarshal(res, &got); err != nil {
		t.Fatalf("%v: %s", err, res)
	}
	check := func(what string, got, want []string) {
		t.Helper()
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("snapshot keys", got.Top, []string{"device_traces", "memsh", "segments"})
	check("segment keys", got.SegKeys, []string{"active_size", "address", "allocated_size", "blocks", "device", "frames",
		"is_expandable", "requested_size", "segment_pool_id", "segment_type", "stream", "total_size"})
	check("block keys", got.BlockKeys, []string{"address", "frames", "requested_size", "size", "state"})
	check("trace entry keys", got.EntryKeys, []string{"action", "addr", "frames", "size", "stream", "time_us"})
	check("oom entry keys", got.OOMKeys, []string{"action", "device_free", "frames", "size", "stream", "time_us"})
	check("actions", got.Actions, []string{"alloc", "free_completed", "free_requested", "oom", "segment_alloc", "segment_free"})
	check("block states", got.States, []string{"active_allocated", "inactive"})
	// The opcodes MemoryViz.js's unpickler reads.
	js := map[string]bool{"PROTO": true, "EMPTY_DICT": true, "MARK": true, "SETITEMS": true, "EMPTY_LIST": true,
		"APPENDS": true, "TUPLE": true, "BININT1": true, "BININT2": true, "BININT": true, "LONG1": true,
		"BINFLOAT": true, "BINUNICODE": true, "NONE": true, "NEWTRUE": true, "NEWFALSE": true, "STOP": true}
	for _, op := range got.Opcodes {
		if !js[op] {
			t.Errorf("opcode %s is not read by memory_viz's unpickler", op)
		}
	}
	if !got.Tiled {
		t.Error("segments' blocks do not tile them")
	}
	if got.Devices != 1 {
		t.Errorf("device_traces for %d devices", got.Devices)
	}
	wantTop := []map[string]any{
		{"filename": "<builtin>", "line": 0.0, "name": "cuda.malloc"},
		{"filename": src, "line": 4.0, "name": "make"},
		{"filename": src, "line": 5.0, "name": "<toplevel>"},
	}
	if !reflect.DeepEqual(got.MakeFrames, wantTop) {
		t.Errorf("frames of the 30 MiB alloc = %v, want %v", got.MakeFrames, wantTop)
	}
	if !reflect.DeepEqual(got.BlockFrames, wantTop) {
		t.Errorf("frames of the live 30 MiB block = %v, want %v", got.BlockFrames, wantTop)
	}
	if got.OOMSize != 2<<30 || got.OOMFree <= 0 {
		t.Errorf("oom entry: size %d, device_free %d", got.OOMSize, got.OOMFree)
	}
}

const checkPy = `
import json, pickle, pickletools, sys
data = open(sys.argv[1], "rb").read()
s = pickle.loads(data)
segs = s["segments"]
traces = s["device_traces"]
entries = [e for t in traces for e in t]
tiled = True
for seg in segs:
    addr = seg["address"]
    for b in seg["blocks"]:
        tiled &= b["address"] == addr
        addr += b["size"]
    tiled &= addr == seg["address"] + seg["total_size"]
    tiled &= seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
MiB = 1 << 20
make = [e for e in entries if e["action"] == "alloc" and e["size"] == 30 * MiB][0]
block = [b for seg in segs for b in seg["blocks"] if b["size"] == 30 * MiB and b["state"] == "active_allocated"][0]
oom = [e for e in entries if e["action"] == "oom"][0]
print(json.dumps({
    "Top": sorted(s.keys()),
    "SegKeys": sorted(segs[0].keys()),
    "BlockKeys": sorted(segs[0]["blocks"][0].keys()),
    "EntryKeys": sorted(make.keys()),
    "OOMKeys": sorted(oom.keys()),
    "Actions": sorted(set(e["action"] for e in entries)),
    "States": sorted(set(b["state"] for seg in segs for b in seg["blocks"])),
    "Opcodes": sorted(set(op.name for op, arg, pos in pickletools.genops(data))),
    "Tiled": tiled,
    "MakeFrames": make["frames"][:3],
    "BlockFrames": block["frames"][:3],
    "OOMSize": oom["size"],
    "OOMFree": oom["device_free"],
    "Devices": len(traces),
}))
`

// frees finds the free_requested entries of the device trace, with their
// frames.
func frees(t *testing.T, r *snapshot.Recorder) (sizes []uint64, frames [][]any) {
	t.Helper()
	for _, e := range get(r.Snapshot(), "device_traces").([]any)[0].([]any) {
		d := e.(snapshot.Dict)
		if get(d, "action") == "free_requested" {
			sizes = append(sizes, get(d, "size").(uint64))
			frames = append(frames, get(d, "frames").([]any))
		}
	}
	return sizes, frames
}

// A free is recorded with the statement that made the garbage (at its end
// at the latest), not with the later allocation whose reclaim found it;
// dump_snapshot reclaims first, and such a free carries its frame.
func TestFreeFrames(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := t.TempDir()
	s.Env().Files = &fsafe.Policy{Roots: []string{dir}} // as --out-dir DIR
	src := fmt.Sprintf(`cuda.record_memory_history()
x = cuda.malloc(4 * MiB)
x = None
y = cuda.malloc(6 * MiB)
def f():
    z = cuda.malloc(8 * MiB)
    z = None
    cuda.dump_snapshot(%q)
f()
`, filepath.Join(dir, "s.pickle"))
	if err := s.Exec("job.star", src); err != nil {
		t.Fatal(err)
	}
	r := s.Env().Values["cuda.memory_history"].(*snapshot.Recorder)
	sizes, frames := frees(t, r)
	if len(sizes) != 2 || sizes[0] != 4<<20 || sizes[1] != 8<<20 {
		t.Fatalf("frees of %v, want 4 MiB then 8 MiB", sizes)
	}
	top := func(f []any) snapshot.Dict { return f[0].(snapshot.Dict) }
	if fr := top(frames[0]); len(frames[0]) != 1 || get(fr, "filename") != "job.star" || get(fr, "line") != 3 || get(fr, "name") != "<toplevel>" {
		t.Errorf("free of x: frames %v, want job.star:3 <toplevel>", frames[0])
	}
	if fr := top(frames[1]); get(fr, "name") != "cuda.dump_snapshot" {
		t.Errorf("free of z: frames %v, want the dump_snapshot call", frames[1])
	}
}

// An alloc or free entry carries the requested bytes, as PyTorch's trace
// (orig_size); the block in the segments has the rounded size.
func TestTraceRequestedSize(t *testing.T) {
	m := simManager(t)
	r := snapshot.New(m)
	r.Enable(nil, 100)
	h, err := m.Alloc("cuda:0", 100)
	if err != nil {
		t.Fatal(err)
	}
	if h.BlockSize() != 512 {
		t.Errorf("block size %d, want 512", h.BlockSize())
	}
	m.Release(h, "test")
	var got []string
	for _, e := range get(r.Snapshot(), "device_traces").([]any)[0].([]any) {
		d := e.(snapshot.Dict)
		if a := get(d, "action").(string); a == "alloc" || a == "free_completed" {
			got = append(got, fmt.Sprintf("%s %d", a, get(d, "size")))
		}
	}
	if want := []string{"alloc 100", "free_completed 100"}; !reflect.DeepEqual(got, want) {
		t.Errorf("trace %v, want %v", got, want)
	}
}
