#!/usr/bin/env python3
"""Prints PyTorch's fit-trial figures (bench/gpu/torch_fit.py phases) beside
memsh's (scripts/fit_phases.star) and their differences, in bytes; also
one rank of a data-parallel job (bench/gpu/fsdp_rank.py phases beside
scripts/fsdp_phases.star).

    python3 bench/gpu/compare_fit.py TORCH.jsonl MEMSH.jsonl
"""
import json
import sys


def rows(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]


CONFIG = ("model", "batch", "seq", "checkpoint", "attention", "strategy", "world", "tp", "reshard_after_forward")


def config(r):
    """The configuration a row belongs to (a file may hold several: run.sh
    appends FSDP2, DDP and the tensor-parallel runs to one)."""
    return tuple(r.get(k) for k in CONFIG)


def main(torch_file, memsh_file):
    t, m = rows(torch_file), rows(memsh_file)
    if not t:
        print("no PyTorch figures in", torch_file)
        return
    mine = {config(r) + (r["point"], r["step"]): r for r in m}
    bad = 0
    seen = []
    for r in t:
        if config(r) not in seen:
            seen.append(config(r))
            c = r
            if "attention" in c:
                what = "%s attention" % c["attention"]
            else:
                what = "%s on %d ranks" % (c["strategy"], c["world"])
                if c.get("tp"):
                    what += " (tensor-parallel degree %d)" % c["tp"]
            print("%s batch %d seq %d%s, %s" % (c["model"], c["batch"], c["seq"], " checkpointed" if c["checkpoint"] else "", what))
            print("%-4s %-10s %14s %14s %11s %14s %14s %11s" % ("step", "point", "torch alloc", "memsh alloc", "d alloc",
                                                              "torch peak", "memsh peak", "d peak"))
        w = mine.get(config(r) + (r["point"], r["step"]))
        if w is None:
            print("%-4d %-10s %14d %14s" % (r["step"], r["point"], r["allocated"], "-"))
            bad += 1
            continue
        da, dp = w["allocated"] - r["allocated"], w["peak"] - r["peak"]
        bad += da != 0 or dp != 0
        print("%-4d %-10s %14d %14d %11d %14d %14d %11d" % (r["step"], r["point"], r["allocated"], w["allocated"], da,
                                                          r["peak"], w["peak"], dp))
    print("%d points differ" % bad)


if __name__ == "__main__":
    main(*sys.argv[1:3])
