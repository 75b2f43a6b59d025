#!/usr/bin/env python3
"""Lines up PyTorch's allocator events (bench/gpu/torch_fit.py trace, JSON
lines) with memsh's (scripts/fit_phases.star --snapshot, a memory_viz
pickle) and prints where they differ: allocations and frees, by size, in
order (the frees between two allocations in size order), with the frames
of each side.

    python3 bench/gpu/compare_trace.py TORCH.jsonl MEMSH.pickle [--context N] [--max N]
"""
import argparse
import difflib
import json
import pickle


def torch_events(path):
    out = []
    for line in open(path):
        e = json.loads(line)
        if e["a"] in ("alloc", "free_completed"):
            out.append(("A" if e["a"] == "alloc" else "F", e["s"], " < ".join(e["f"][:3])))
    return out


def memsh_events(path):
    snap = pickle.load(open(path, "rb"))
    out = []
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_completed"):
            fr = [("%s:%d %s" % (f["filename"].rsplit("/", 1)[-1], f["line"], f["name"])) for f in e.get("frames", [])[:3]]
            out.append(("A" if e["action"] == "alloc" else "F", e["size"], " < ".join(fr)))
    return out


def normalized(ev):
    """Frees between two allocations in size order: the order in which
    blocks are freed before the next allocation does not change which
    blocks that allocation finds free (coalescing is order-independent)."""
    out, run = [], []
    for e in ev + [("A", -1, "")]:
        if e[0] == "F":
            run.append(e)
            continue
        out.extend(sorted(run, key=lambda x: x[1]))
        run = []
        if e[1] >= 0:
            out.append(e)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("torch")
    ap.add_argument("memsh")
    ap.add_argument("--context", type=int, default=2)
    ap.add_argument("--max", type=int, default=30)
    a = ap.parse_args()
    t, m = normalized(torch_events(a.torch)), normalized(memsh_events(a.memsh))
    tk = [(k, s) for k, s, _ in t]
    mk = [(k, s) for k, s, _ in m]
    print("PyTorch: %d allocations, %d frees; memsh: %d allocations, %d frees" % (
        sum(k == "A" for k, _ in tk), sum(k == "F" for k, _ in tk), sum(k == "A" for k, _ in mk), sum(k == "F" for k, _ in mk)))
    sm = difflib.SequenceMatcher(None, tk, mk, autojunk=False)
    shown = 0
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        shown += 1
        if shown > a.max:
            print("... more differences")
            break
        print("--- %s: PyTorch events %d..%d, memsh events %d..%d" % (op, i1, i2, j1, j2))
        for i in range(max(0, i1 - a.context), i1):
            print("    = %s %10d  %s" % (t[i][0], t[i][1], t[i][2]))
        for i in range(i1, min(i2, i1 + 8)):
            print("  T %s %10d  %s" % (t[i][0], t[i][1], t[i][2]))
        for j in range(j1, min(j2, j1 + 8)):
            print("  M %s %10d  %s" % (m[j][0], m[j][1], m[j][2]))
    print("%d differing runs" % sum(op != "equal" for op, *_ in sm.get_opcodes()))


if __name__ == "__main__":
    main()
