#!/usr/bin/env bash
# On the GPU machine: conformance (strict) of the nvidia backend with its Triton kernels, then
# the kernel benchmarks. Carry .whl (fla-core) to compare the delta-rule kernel with fla.
set -uo pipefail
out=${OUT:-.out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
bash scripts/device_conformance.sh nvidia > "$out/device_conformance.log" 2>&1
grep -E "passed|failed|FAILED" "$out/device_conformance.log" | tail -12
python3 scripts/bench_delta_rule.py 2>&1 | tee "$out/bench_delta_rule.txt" | tail -40
python3 scripts/bench_sparse_mla.py --no-reference 2>&1 | tee "$out/bench_sparse_mla.txt" | tail -30
