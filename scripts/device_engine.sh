#!/usr/bin/env bash
# On the GPU machine: conformance (strict) for the nvidia backend, then engine throughput of
# Qwen3.5-0.8B at its real dimensions with random weights (bf16). Results in $OUT.
set -uo pipefail
out=${OUT:-.out}
mkdir -p "$out"
bash scripts/device_conformance.sh nvidia > "$out/device_conformance.log" 2>&1
tail -6 "$out/device_conformance.log"
python3 scripts/bench_engine.py --preset qwen3.5-0.8b --device cuda --dtype bf16 \
  --concurrency 1,8,32,64 --prompt 128 --new 64 --budget 4096 --prefix 512 --chunk 64 \
  --json "$out/engine_qwen3.5-0.8b_h200.json" 2>&1 | tail -8
