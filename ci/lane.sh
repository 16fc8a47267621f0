#!/usr/bin/env bash
# One CI lane: bash ci/lane.sh LANE   (lanes: ci/matrix.yaml; what each runs: ci/README.md)
#
# Writes the lane's results CSV to ${HWINFER_RESULTS_DIR:-ci/results}/LANE.csv (schema in
# ci/README.md) and its logs to ${HWINFER_LOG_DIR:-${OUT:-.out}/lane-LANE}. Every step runs even
# when an earlier one fails; the exit status is non-zero if any step failed.
# Set HWINFER_COMMIT where the tree has no .git (e.g. a copied tree on a GPU machine).
set -uo pipefail
lane=${1:-}
lanes="cpu nvidia-sm90 nvidia-sm100 amd-gfx942 amd-gfx950 xpu npu"
case " $lanes " in
  *" $lane "*) ;;
  *) echo "usage: bash ci/lane.sh LANE   (one of: $lanes)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
results=${HWINFER_RESULTS_DIR:-ci/results}
logs=${HWINFER_LOG_DIR:-${OUT:-.out}/lane-$lane}
csv="$results/$lane.csv"
mkdir -p "$results" "$logs"
# LANE_README_DONE=1: the caller (.ci/run) already ran the README's test command into this CSV.
# LANE_PART (GPU lanes, when one call cannot hold the whole lane): "I/N" runs part I of N of the
# strict conformance (whole ops, tests/conformance --shard) and no benchmarks; "bench" the
# benchmarks alone. The CSV starts afresh with part 0/N (or a whole lane), later parts append.
part=${LANE_PART:-}
case "$part" in ""|bench|[0-9]*/[0-9]*) ;; *) echo "LANE_PART must be I/N or bench, got $part" >&2; exit 2 ;; esac
if [ "${LANE_README_DONE:-0}" != 1 ] && { [ -z "$part" ] || [ "${part%%/*}" = 0 ]; }; then rm -f "$csv"; fi
HWINFER_COMMIT=${HWINFER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ ${#HWINFER_COMMIT} -eq 40 ] && HWINFER_COMMIT=${HWINFER_COMMIT:0:7}  # a full sha from CI
export HWINFER_COMMIT
export HWINFER_RESULTS_DATE=${HWINFER_RESULTS_DATE:-$(date -u +%F)}
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
bridge=(-p hwinfer.ci.pytest_plugin --results-csv "$csv")
budget=${LANE_BUDGET_S:-480}   # benchmarks stop starting once the lane has run this long
bench_timeout=${BENCH_TIMEOUT_S:-150}
failed=()
start=$SECONDS

step() {  # step NAME CMD...: run, log the outcome, keep going
  local name=$1; shift
  echo "== $lane: $name"
  "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "!! $lane: $name failed (rc=$rc)"; failed+=("$name"); fi
  return 0
}

ensure_installed() {  # GPU machines: hwinfer into the machine's own torch, no network
  if ! $PY -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.name == 'cpu' for e in m.entry_points(group='hwinfer.backends')) else 1)" 2>/dev/null; then
    $PY -m pip install -q --no-deps --no-build-isolation -e . > "$logs/install.log" 2>&1 || {
      cat "$logs/install.log"; return 1; }
  fi
}

check_device() {  # the lane's hardware must be what this machine has
  $PY - "$1" "$2" <<'PY'
import sys
from hwinfer.backend import resolve_device
kind, arch = sys.argv[1], sys.argv[2]
dev = resolve_device(kind)
print(dev.describe())
if arch and dev.arch != arch:
    sys.exit(f"lane wants arch {arch}, this machine has {dev.arch}")
PY
}

benchmarks() {  # every op benchmark script; model/engine/load benchmarks give no op rows
  local backend=$1 arch=$2 device=$3 script name args
  for script in scripts/bench_*.py; do
    name=$(basename "$script" .py)
    case "$name" in bench_engine|bench_load|bench_model) continue ;; esac
    if [ $((SECONDS - start)) -ge "$budget" ]; then
      echo "!! $lane: lane budget of ${budget}s spent, $name not run"; failed+=("budget:$name"); continue
    fi
    args=""
    case "$name" in bench_sparse_mla) args="--no-reference" ;; esac
    # LANE_QUICK=1: the short shape set of every script that has one (a lane with little time).
    if [ "${LANE_QUICK:-0}" = 1 ] && grep -q -- "--quick" "$script"; then args="$args --quick"; fi
    echo "== $lane: $name $args"
    # stdout is what is parsed (CSV lines, or the older scripts' tables); newer scripts write
    # their readable table to stderr, kept apart so nothing is counted twice.
    # shellcheck disable=SC2086
    timeout "$bench_timeout" $PY "$script" $args > "$logs/$name.txt" 2> "$logs/$name.err" \
      || { echo "!! $lane: $name rc=$?"; tail -5 "$logs/$name.err"; failed+=("$name"); }
    $PY -m hwinfer.ci.bench --script "$name.py" --backend "$backend" --arch "$arch" \
      --device "$device" --input "$logs/$name.txt" --csv "$csv"
  done
}

gpu_lane() {  # gpu_lane BACKEND TORCH_DEVICE ARCH
  local backend=$1 kind=$2 arch=$3
  step "install" ensure_installed
  (command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
   command -v rocm-smi >/dev/null && rocm-smi --showproductname
   $PY -c "import torch; print('torch', torch.__version__)"
   $PY -c "import triton; print('triton', triton.__version__)") > "$logs/machine.txt" 2>&1
  cat "$logs/machine.txt"
  step "device is $kind ${arch:-any}" check_device "$kind" "$arch"
  if [ "$part" != bench ]; then
    local shard=() tag=""
    [ -n "$part" ] && shard=(--shard "$part") && tag="-part${part%%/*}"
    step "hwinfer info --strict" bash -c "hwinfer info --strict > '$logs/info.txt'"
    step "conformance --backend $backend --strict ${shard[*]}" $PY -m pytest tests/conformance \
      --backend "$backend" --strict -q -p no:cacheprovider "${shard[@]}" "${bridge[@]}" \
      --junitxml="$logs/conformance$tag.xml"
  fi
  if [ -n "$arch" ] && { [ -z "$part" ] || [ "$part" = bench ]; }; then
    local device
    device=$($PY -c "from hwinfer.backend import resolve_device; print(resolve_device('$kind').name)" 2>/dev/null)
    benchmarks "$backend" "$arch" "$device"
  fi
}

case "$lane" in
  cpu)
    # The README test command (CPU conformance and the AOT compiles included), through the
    # bridge; then the strict CPU gate, the GPU tables' Triton kernels under the interpreter.
    if [ "${LANE_README_DONE:-0}" != 1 ]; then
      step "README test command: pytest" $PY -m pytest -q "${bridge[@]}"
    fi
    step "conformance --backend cpu --strict" $PY -m pytest tests/conformance/test_conformance.py \
      -q --backend cpu --strict -p no:cacheprovider
    for backend in nvidia amd; do
      step "Triton kernels of $backend under TRITON_INTERPRET=1" env TRITON_INTERPRET=1 \
        $PY -m pytest tests/conformance/test_conformance.py -q -k test_impl_matches_reference \
        --backend "$backend" -p no:cacheprovider "${bridge[@]}"
    done
    step "hwinfer info --strict" bash -c "hwinfer info --strict > '$logs/info.txt'"
    step "support matrix from this lane" $PY ci/matrix.py --results "$csv" \
      --out "$logs/support-matrix.md" --plots ""
    ;;
  nvidia-sm90) gpu_lane nvidia cuda sm_90 ;;
  nvidia-sm100) gpu_lane nvidia cuda sm_100 ;;
  amd-gfx942) gpu_lane amd cuda gfx942 ;;
  amd-gfx950) gpu_lane amd cuda gfx950 ;;
  # No benchmarks yet: the scripts time CUDA tensors.
  xpu) gpu_lane xpu xpu "" ;;
  npu) gpu_lane npu npu "" ;;
esac

rows=$( [ -f "$csv" ] && $PY -c "import sys; print(sum(1 for _ in open(sys.argv[1])) - 1)" "$csv" || echo 0)
echo "== $lane: $rows result rows in $csv ($((SECONDS - start)) s)"
if [ ${#failed[@]} -ne 0 ]; then
  echo "== $lane: FAILED steps: ${failed[*]}"
  exit 1
fi
echo "== $lane: ok"
