#!/bin/sh
# bench/meta/run.sh [N]: per-op cost of memsh on a simulated meta GPU
# (lazy and exact peak modes) against PyTorch's meta device, same op mix
# (meta_ops.star, torch_meta.py), same machine, one run. memsh's per-op
# time is (time of N rounds - time of 0 rounds) / (8 N), so start-up and
# model set-up cancel out. Needs Debian's python3-torch (apt-get install
# python3-torch, as root; a developer's benchmark step, never CI).
set -eu
cd "$(dirname "$0")/../.."
N=${1:-5000}
go build -o /tmp/memsh-bench ./cmd/memsh
t() { # seconds of one run
	s=$(date +%s.%N)
	/tmp/memsh-bench --quiet --device sim:80GiB,meta --peak "$1" bench/meta/meta_ops.star "$2" >/dev/null
	e=$(date +%s.%N)
	echo "$e - $s" | bc -l
}
for mode in lazy exact; do
	t0=$(t $mode 0)
	t1=$(t $mode "$N")
	echo "memsh $mode: $(echo "($t1 - $t0) / (8 * $N) * 1000000" | bc -l | cut -c1-6) us/op"
done
/usr/bin/python3 bench/meta/torch_meta.py "$N"
