#!/usr/bin/env bash
# Run on a GPU machine (the device tool): install hwinfer without dependencies into the
# machine's own torch, show the op table, run the conformance suite for the given backend, and
# time the Triton rms_norm. Results go to $OUT (or ./.out when unset).
set -uo pipefail
backend=${1:-nvidia}
out=${OUT:-.out}
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || {
  cat "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
hwinfer info --strict | tee "$out/info.txt"
python3 -m pytest tests/conformance --backend "$backend" --strict -q -p no:cacheprovider \
  -o junit_family=xunit2 --junitxml="$out/conformance.xml" 2>&1 | tail -25 | tee "$out/conformance.txt"
python3 scripts/bench_rms_norm.py | tee "$out/bench_rms_norm.txt"
