"""Prints PyTorch's phase figures (a torchref JSON file) beside memsh's
(scripts/phases.star --json lines) and their differences, in bytes.

    python3 bench/torchref/compare.py TORCH.json MEMSH.jsonl
"""
import json
import sys


def main(torch_file, memsh_file):
    ref = json.load(open(torch_file))
    want = {(p["phase"], p["step"]): p for p in ref["phases"]}
    rows = [json.loads(line) for line in open(memsh_file) if line.strip().startswith("{")]
    print("%s on %s (PyTorch %s)" % (ref["case"], ref.get("device", "?"), ref.get("torch_version", "?")))
    print("%-5s %-10s %14s %14s %14s %14s %10s %10s" % ("step", "phase", "torch end", "memsh end", "torch peak", "memsh peak", "d end", "d peak"))
    bad = 0
    for r in rows:
        w = want.get((r["phase"], r["step"]))
        if w is None:
            continue
        de, dp = r["end"] - w["end"], r["peak"] - w["peak"]
        bad += de != 0 or dp != 0
        print("%-5d %-10s %14d %14d %14d %14d %10d %10d" % (r["step"], r["phase"], w["end"], r["end"], w["peak"], r["peak"], de, dp))
    print("%d phases differ" % bad)


if __name__ == "__main__":
    main(*sys.argv[1:3])
