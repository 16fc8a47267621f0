#!/usr/bin/env bash
# On the GPU machine (device tool), issue 6's checks and numbers in one call: install, op table,
# conformance --strict (junit), the model oracle tests through the GPU kernels, whole-model
# speed (Qwen3.5-0.8B vs transformers and the roofline), and every kernel benchmark (quick).
# Carry .whl (fla-core 0.6.0) for the fla comparisons. Results in $OUT.
set -uo pipefail
out=${OUT:-.out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null
bash scripts/device_conformance.sh nvidia > "$out/device_conformance.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$out/device_conformance.log" | tail -15
HWINFER_TEST_DEVICE=cuda timeout 420 python3 -m pytest tests/models -q -p no:cacheprovider \
  -o junit_family=xunit2 --junitxml="$out/models.xml" > "$out/models.txt" 2>&1
grep -E "passed|failed|FAILED" "$out/models.txt" | tail -15
timeout 420 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 64 \
  --profile --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
grep -v "^# ops" "$out/bench_model_qwen.txt" | tail -60
for bench in ${BENCHES:-bench_delta_chunk bench_paged_attention bench_moe bench_sparse_mla bench_indexer bench_small_ops}; do
  [ -f "scripts/$bench.py" ] || continue
  timeout 240 python3 "scripts/$bench.py" --quick > "$out/$bench.csv" 2> "$out/$bench.err"
  echo "== $bench rc=$?"; tail -3 "$out/$bench.err"
done
