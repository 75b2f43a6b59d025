"""Formats bench/kernels timings (lines LIB OP N MIN_S MEAN_S) as the
Markdown table of bench/README.md: mean (min) milliseconds per library and
memsh's ratios of means to NumPy and PyTorch (and to memsh before, when
run.sh was given a base commit). A figure timed in several rounds keeps
its best round: the lowest mean and the lowest minimum."""

import sys

times = {}
order = []
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) != 5:
        continue
    lib, op, n = parts[0], parts[1], int(parts[2])
    lo, mean = float(parts[3]), float(parts[4])
    if (lib, op, n) in times:
        lo, mean = min(lo, times[(lib, op, n)][0]), min(mean, times[(lib, op, n)][1])
    times[(lib, op, n)] = (lo, mean)
    if (op, n) not in order:
        order.append((op, n))

libs = [l for l in ("before", "memsh", "numpy", "torch") if any(k[0] == l for k in times)]


def cell(v):
    return "%.2f (%.2f)" % (v[1] * 1e3, v[0] * 1e3) if v else "–"


def ratio(a, b):
    return "%.2f×" % (a[1] / b[1]) if a and b else "–"


head = ["op", "n"] + ["%s mean (min) ms" % l for l in libs]
head += ["memsh / NumPy", "memsh / PyTorch"] + (["before / after"] if "before" in libs else [])
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for op, n in order:
    row = [op, "4096²" if op == "t_contiguous" else "%dM" % (n >> 20)]
    row += [cell(times.get((l, op, n))) for l in libs]
    m = times.get(("memsh", op, n))
    row += [ratio(m, times.get(("numpy", op, n))), ratio(m, times.get(("torch", op, n)))]
    if "before" in libs:
        row.append(ratio(times.get(("before", op, n)), m))
    print("| " + " | ".join(row) + " |")
