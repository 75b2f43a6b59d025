#!/bin/sh
# bench/torchref/run.sh: regenerates testdata/torchref/*.json, the PyTorch
# reference memory figures memsh's training-step simulation is checked
# against. CPU by default (Debian's python3-torch 1.13, CPU-only); pass
# `--device cuda` on a machine with a CUDA PyTorch to write
# testdata/torchref/cuda/*.json instead. Extra arguments (case names) are
# passed through: bench/torchref/run.sh gpt2_tiny op_relu
#
# Installs python3-torch with apt-get when it is missing and this runs as
# root: a developer's reference step, never part of CI or the build.
set -eu

cd "$(dirname "$0")/../.."
PY=/usr/bin/python3 # Debian's python, which sees python3-torch

if ! "$PY" -c 'import torch' 2>/dev/null; then
	if [ "$(id -u)" = 0 ]; then
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
	else
		echo "run.sh: needs python3-torch (apt-get install python3-torch)" >&2
		exit 1
	fi
fi

exec "$PY" bench/torchref/torchref.py "$@"
