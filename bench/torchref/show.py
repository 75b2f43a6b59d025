#!/usr/bin/env python3
"""Print a torchref JSON file's phases and events compactly.

  python3 bench/torchref/show.py testdata/torchref/CASE.json [STEP [PHASE]]
"""
import json
import sys


def short(op):
    if op is None:
        return "-"
    return op.replace("autograd::engine::evaluate_function: ", "bw:")


def main():
    d = json.load(open(sys.argv[1]))
    step = int(sys.argv[2]) if len(sys.argv) > 2 else None
    phase = sys.argv[3] if len(sys.argv) > 3 else None
    print(d["case"], d["torch_version"], "param_bytes", d.get("param_bytes"))
    for p in d["phases"]:
        if (step and p["step"] != step) or (phase and p["phase"] != phase):
            continue
        print(f"== step {p['step']} {p['phase']}: start {p['start']} end {p['end']} peak {p['peak']}"
              + (f"  (cpu_all {p['cpu_all']})" if "cpu_all" in p else ""))
        for e in p.get("events", []):
            sign = "+" if e["ev"] == "alloc" else "-"
            print(f"  {sign}{abs(e['bytes']):>9} #{e['id']!s:<5} raw {e['raw']:>9} "
                  f"{short(e['op']):<28} < {short(e['top']):<36} {e.get('host', '')}")


if __name__ == "__main__":
    main()
