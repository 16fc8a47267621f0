#!/usr/bin/env bash
# On the GPU machine (device tool), issue 6's checks and numbers; each call fits the tool's
# 10-minute limit:
#   bash scripts/device_issue6.sh check     # install, op table, conformance --strict (junit),
#                                         # the model oracle tests through the GPU kernels
#   bash scripts/device_issue6.sh diagnose  # model oracle + CUDA-graph tests on the GPU, then
#                                         # the failures again under HWINFER_SHADOW=raise, which
#                                         # names the first op whose kernel leaves its reference
#   bash scripts/device_issue6.sh profile   # kernel breakdowns of Kimi-Linear / DeepSeek-V4-Flash
#                                         # (4 layers) prefill and decode, chunked GDN/KDA vs fla
#   bash scripts/device_issue6.sh lane 0/3  # one part of the sm_90 lane (0/3, 1/3, 2/3, bench):
#                                         # copy $OUT/results/nvidia-sm90.csv to
#                                         # .out/nvidia-sm90.part.csv between parts (carry it)
#   bash scripts/device_issue6.sh s23a      # the Gluon kernel's forms (WS_TESTS, WS_VARIANTS):
#                                         # card test each, strict, V4 shapes timed
#   bash scripts/device_issue6.sh s22b      # DeepSeek-V4-Flash 4 layers, Gluon sparse MLA off / on
#   bash scripts/device_issue6.sh s25a      # chunked GDN / KDA: strict, per kernel with the bf16
#                                         # hand-off and the fp32 one, then beside fla
#   bash scripts/device_issue6.sh s25b      # DeepSeek-V4-Flash 4 layers over its packed FP8 cache,
#                                         # the Gluon FP8 kernel off / on; on an H200 also s23a's
#                                         # default sparse MLA timings
#   bash scripts/device_issue6.sh s25c      # chunked GDN / KDA: strict with the lane's CSV rows,
#                                         # per kernel (S25C_VARIANTS: --variant ... flags; at
#                                         # d98ff5d it timed a shared diagonal loop and the WY
#                                         # kernel's num_stages, both removed)
#   bash scripts/device_issue6.sh s27a      # the new GDN / KDA defaults: strict, models, vs fla
#   bash scripts/device_issue6.sh s28a      # KDA's tile cumsums: strict, models, forms, vs fla / base
#   bash scripts/device_issue6.sh s32a      # state kernel launches (BV, warps, stages, no prefetch)
#                                         # beside fla per kernel; ncu of both state kernels
#   bash scripts/device_issue6.sh s32b      # the launch rule s32a gave against the one before:
#                                         # strict rows, GDN / KDA per kernel, fla at KDA 8 x 2k
#   bash scripts/device_issue6.sh s34a      # s33d, plus the decode graph's greedy argmax and
#                                         # Qwen3.5's fused decode attention, each vs before
#   bash scripts/device_issue6.sh s34c      # the fused decode attention's second form vs the
#                                         # two ops; the greedy argmax outside again
#   bash scripts/device_issue6.sh s36a      # greedy_tokens, the split sampler, the lm_head's fp32
#                                         # logits, paged attention's merge in the split kernel:
#                                         # strict (the merge on too), ops alone, graph tests,
#                                         # b=32 profile
#   bash scripts/device_issue6.sh s36b      # Qwen3.5's step vs torch's argmax / the merge in
#                                         # the split kernel / 8 splits / the argmax outside
#   bash scripts/device_issue6.sh s35b      # s34d's H200 part: sparse MLA, Qwen3.5 whole, GDN /
#                                         # KDA 1 x 16k beside fla (carry .whl)
#   bash scripts/device_issue6.sh s34d      # the b=32 replay's kernels, greedy argmax in / out;
#                                         # on an H200 sparse MLA, Qwen3.5 whole, GDN / KDA vs fla
#   bash scripts/device_issue6.sh s34b      # chunked GDN / KDA only: strict rows, per kernel
#                                         # beside fla at 1 x 16k and 8 x 2k (carry .whl)
#   bash scripts/device_issue6.sh s33a      # s32c's forms as defaults: strict gdn + kda rows,
#                                         # model tests, per kernel beside fla, Qwen3.5 whole
#   bash scripts/device_issue6.sh s32c      # the state step's decay loaded ahead and
#                                         # GDN's output stage on q's raw rows, both on in the
#                                         # call's copy: strict, per kernel against each off;
#                                         # Nsight Compute on both state kernels (ncu.tgz)
#   bash scripts/device_issue6.sh s31a      # (prepared) X in bf16 (X_16BIT), GDN's _wu_kernel on
#                                         # the scaled X (GDN_WU_RAW), KDA's output stage on q e^c
#                                         # (KDA_OUT_QG), turned on in the call's copy: strict, per
#                                         # kernel against the forms before; model tests
#   bash scripts/device_issue6.sh s30c      # GDN's state kernel with its row scales prefetched:
#                                         # strict gdn, per kernel beside the decayed keys' form
#   bash scripts/device_issue6.sh s30b      # GDN's state stage on raw keys + row scales, u in
#                                         # bf16: strict, GDN / KDA per kernel with variants, fla
#                                         # (ran at 1797a11)
#   bash scripts/device_issue6.sh s29c      # the diagonal loop's fused update, value blocks first:
#                                         # strict, models, per kernel; sparse MLA on an H200
#   bash scripts/device_issue6.sh s29b      # KDA's diagonal kernel in the tiles' layout: strict,
#                                         # vs fla / the tree before / sparse MLA on an H200 (ran
#                                         # at 7bbc8da; its DIAG_AHEAD variant is gone since)
#   bash scripts/device_issue6.sh bench     # whole-model speed vs transformers and the roofline,
#                                         # every kernel benchmark (--quick)
# The phases of earlier sessions (s11a ... s21e and the named ones before them), which
# docs/kernels.md, docs/engine.md and docs/hardware-runs.md quote as the commands of their
# numbers, ran at the trees those docs name; they are in git history, e.g.
# `git show c29c3a5:scripts/device_issue6.sh` (the last tree that had them all; `s22a`, which
# `s23a` replaces, is at a5916f9; `s26a`, which timed the since removed quarters and stacked
# forms, is at ee04e58).
# s31a, s32a and s32b set delta_chunk.STATE_PREFETCH, removed after them with the manual prefetch
# it chose (they ran at 6fab5ae, 06f2fb8 and 1805255).
# s34a and s34c timed the fused decode attention (rms_norm_rope_paged_attention, FUSE_NEW_ROW)
# and s34a the GEMV chain in one launch (gemv_chain.py, bench_decode_chain.py --chain), all
# removed after them: they ran at 547a5ee and 3e5fd6a (s33d, which s34a replaced, at 3e5fd6a).
# Carry .whl (fla-core 0.6.0) for the fla comparisons. Results in $OUT.
set -uo pipefail
phase=${1:-check}
out=${OUT:-.out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null

strict() {  # strict conformance on the card of the ops matching $2, within $1 seconds
  timeout "$1" python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "$2" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance.txt" | tail -6
}

strict_rows() {  # strict conformance of the ops matching $1 with the rows for ci/results
  HWINFER_RESULTS_DATE=$(date -u +%F) timeout 150 python3 -m pytest tests/conformance --backend nvidia \
    --strict -q -p no:cacheprovider -k "$1" -p hwinfer.ci.pytest_plugin \
    --results-csv "$out/conformance_rows.csv" > "$out/conformance_default.txt" 2>&1
  echo "== strict, defaults"; grep -E "passed|failed|FAILED" "$out/conformance_default.txt" | tail -6
}

sparse_mla_on_h200() {  # on an H200 only: the V4 sparse MLA decode's timings, within $1 seconds
  if grep -q H200 "$out/gpu.txt"; then
    timeout "$1" python3 scripts/bench_sparse_mla.py --only dsv4 --ws --quick \
      > "$out/bench_ws.csv" 2> "$out/bench_ws.err"
    echo "== bench_sparse_mla --ws rc=$?"; grep -v "Warn\|warn" "$out/bench_ws.err" | grep "sparse_mla\|rror\|ceiling" | cut -c1-160 | tail -40
  fi
}

kda_base_tree() {  # KDA per kernel in the tree packed as .whl/base.tar (git archive BASE hwinfer)
  if [ -f .whl/base.tar ]; then
    rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .whl/base.tar -C /tmp/base
    PYTHONPATH=/tmp/base:${PYTHONPATH:-} timeout "$1" python3 scripts/bench_delta_chunk.py --kinds kda \
      --shapes 1x16384,8x2048 --no-torch --no-fla --no-variants --breakdown \
      > "$out/bench_base.csv" 2> "$out/bench_base.err"
    echo "== base tree rc=$?"; grep "triton\|#   " "$out/bench_base.err" | grep -v "chunk_table\|regs\|warn" | cut -c1-150 | head -20
  fi
}

per_kernel() {  # bench_delta_chunk.py per kernel (--breakdown) within $1 seconds; the rest are its
  # arguments (kinds, shapes, variants); the calls and kernel lines shown. Output files named
  # $BENCH (default bench_delta_chunk) .csv / .err.
  local limit=$1; shift
  local name=${BENCH:-bench_delta_chunk}
  timeout "$limit" python3 scripts/bench_delta_chunk.py --no-torch --no-variants --breakdown "$@" \
    > "$out/$name.csv" 2> "$out/$name.err"
  echo "== $name rc=$?"; grep -v "Warn\|warn\|at::native\|anonymous\|Memcpy\|^# hwinfer" \
    "$out/$name.err" | grep "triton\|fla\|#   " | grep -v "chunk_table\|regs" | cut -c1-150 | head -150
}

models_on_card() {  # the model tests matching $1 on the card
  HWINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest tests/models -q -p no:cacheprovider \
    -k "$1" > "$out/models.txt" 2>&1
  echo "== models ($1) on the card"; grep -E "passed|failed|FAILED" "$out/models.txt" | tail -6
}

ncu_state() {  # Nsight Compute on our state kernel and fla's h kernel at 1 x 16k for each kind
  # given: the report, its details page and its per-SASS-line stall samples, packed in one
  # file ($out/ncu.tgz: the device tool returns only a few files)
  local dir=/tmp/ncu; mkdir -p $dir
  for kind in "$@"; do
    timeout 100 ncu --clock-control none --profile-from-start off \
      -k regex:"_state_kernel|fwd_kernel_h" --section SpeedOfLight --section WarpStateStats \
      --section LaunchStats --section Occupancy --section SourceCounters \
      --section MemoryWorkloadAnalysis -f -o "$dir/ncu_$kind" \
      python3 scripts/probe_delta_chunk.py $kind 1x16384 > "$dir/ncu_$kind.txt" 2>&1
    echo "== ncu $kind rc=$?"; grep -v "^==PROF==" "$dir/ncu_$kind.txt" | tail -3
    ncu -i "$dir/ncu_$kind.ncu-rep" --page details > "$dir/ncu_${kind}_details.txt" 2>&1
    ncu -i "$dir/ncu_$kind.ncu-rep" --page source --print-source sass --csv \
      > "$dir/ncu_${kind}_sass.csv" 2>&1
    grep -E "^  [a-z_]|Duration|Registers|Block Size|Grid Size|Warp Cycles|Achieved Occ|Throughput|Hit Rate" \
      "$dir/ncu_${kind}_details.txt" | cut -c1-120 | head -60
  done
  tar -czf "$out/ncu.tgz" -C $dir .
}

if [ "$phase" = check ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
  hwinfer info --strict > "$out/info.txt" 2>&1; echo "hwinfer info --strict rc=$?"
  timeout 300 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -o junit_family=xunit2 --junitxml="$out/conformance.xml" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED|Error" "$out/conformance.txt" | tail -25
  HWINFER_TEST_DEVICE=cuda timeout 220 python3 -m pytest tests/models -q -p no:cacheprovider -x \
    -o junit_family=xunit2 --junitxml="$out/models.xml" > "$out/models.txt" 2>&1
  grep -E "passed|failed|FAILED|Error" "$out/models.txt" | tail -12
elif [ "$phase" = diagnose ]; then
  HWINFER_TEST_DEVICE=cuda timeout 260 python3 -m pytest tests/models tests/engine/test_graphs.py -q \
    -p no:cacheprovider -rf --tb=short > "$out/models.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/models.txt" | tail -30
  failed=$(grep "^FAILED" "$out/models.txt" | sed 's/^FAILED //; s/ - .*//' | sort -u)
  if [ -n "$failed" ]; then
    HWINFER_SHADOW=raise HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest $failed -q \
      -p no:cacheprovider -rf --tb=line > "$out/shadow.txt" 2>&1
    grep -E "^FAILED|passed|failed" "$out/shadow.txt" | cut -c1-400 | tail -30
  fi
elif [ "$phase" = s23a ]; then
  # The Gluon kernel's forms one at a time (a deadlock in one costs only its timeout), strict
  # conformance with the default forced on, then the V4 shapes against the Triton kernel.
  for v in ${WS_TESTS:-default pw1_qk_twice pw1_qk_split idx_in_loop overlap k32 fp8}; do
    timeout 100 python3 -m pytest tests/kernels/test_sparse_mla_ws.py -q -p no:cacheprovider \
      -k "$v" > "$out/test_ws_$v.txt" 2>&1
    echo "== test_sparse_mla_ws $v rc=$?"; grep -E "passed|failed|Error|assert" "$out/test_ws_$v.txt" | cut -c1-200 | tail -4
  done
  HWINFER_SPARSE_MLA_WS=1 strict 90 "sparse_mla_decode"
  timeout ${WS_BENCH_S:-200} python3 scripts/bench_sparse_mla.py --only ${WS_ONLY:-dsv4} --ws --quick \
    ${WS_VARIANTS:+--ws-variants "$WS_VARIANTS"} > "$out/bench_ws.csv" 2> "$out/bench_ws.err"
  echo "== bench_sparse_mla --ws rc=$?"; grep -v "Warn\|warn" "$out/bench_ws.err" | grep "sparse_mla\|rror" | cut -c1-160 | tail -60
elif [ "$phase" = s22b ]; then
  # DeepSeek-V4-Flash, 4 real-size layers: decode with the Gluon sparse MLA off / on.
  for ws in 0 1; do
    HWINFER_SPARSE_MLA_WS=$ws timeout 150 python3 scripts/bench_model.py --preset deepseek-v4-flash \
      --layers 4 --batch 1,32 --prompt ${PROMPT:-1024} --new 16 --no-eager --no-hf --kv-format bf16 \
      --csv "$out/model.csv" \
      > "$out/model_v4_ws$ws.txt" 2>&1
    echo "== V4 ws=$ws rc=$?"; grep "^{\|Error" "$out/model_v4_ws$ws.txt" | cut -c1-260 | tail -3
  done
elif [ "$phase" = s25a ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  strict 150 "gdn_chunked or kda_chunked"
  D=hwinfer.kernels.triton.delta_chunk
  timeout 200 python3 scripts/bench_delta_chunk.py --kinds gdn,kda --shapes 1x16384,8x2048 --no-torch \
    --no-fla --no-variants --breakdown --variant "fp32_handoff@$D:HANDOFF_16BIT=False" \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|at::native\|anonymous\|Memcpy" \
    "$out/bench_delta_chunk.err" | grep "triton\|_kernel" | cut -c1-150 | head -60
  timeout ${FLA_S:-240} python3 scripts/bench_delta_chunk.py --kinds kda,gdn --shapes 1x16384 --no-torch \
    --no-variants > "$out/bench_delta_chunk_fla.csv" 2> "$out/bench_delta_chunk_fla.err"
  echo "== bench_delta_chunk with fla rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_fla.err" \
    | grep "triton\|fla" | cut -c1-150 | head -20
elif [ "$phase" = s25c ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  HWINFER_RESULTS_DATE=$(date -u +%F) timeout 200 python3 -m pytest tests/conformance --backend nvidia \
    --strict -q -p no:cacheprovider -k "gdn_chunked or kda_chunked" -p hwinfer.ci.pytest_plugin \
    --results-csv "$out/conformance_rows.csv" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance.txt" | tail -6
  D=hwinfer.kernels.triton.delta_chunk
  timeout 300 python3 scripts/bench_delta_chunk.py --kinds kda,gdn --shapes 1x16384,8x2048 --no-torch \
    --no-fla --no-variants --breakdown ${S25C_VARIANTS:-} \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|at::native\|anonymous\|Memcpy\|^# hwinfer" \
    "$out/bench_delta_chunk.err" | grep "triton\|_diag_kernel\|_wy_blocked" | cut -c1-150 | head -60
elif [ "$phase" = s27a ]; then
  # The new defaults (the row loop's block inverse, bf16 state products for 16-bit inputs):
  # strict conformance with the rows for ci/results, the model tests of the two linear-attention
  # families on the card, and GDN / KDA beside fla (carry .whl) and beside the old defaults.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  models_on_card "qwen or kimi"
  per_kernel 250 --kinds gdn,kda --shapes 1x16384,8x2048 \
    --variant "old_defaults@$D:DIAG_BLOCK_INV=False;$D:STATE_DOTS='split'"
elif [ "$phase" = s28a ]; then
  # KDA's decays from the diagonal kernel's tile cumsums (KDA_SPANS="cumsum", the new default):
  # strict conformance with the rows for ci/results, the Kimi model tests on the card,
  # KDA per kernel beside the scans, the WY kernel's warps, fla, and (with a
  # base tree's hwinfer packed as .whl/base.tar: git archive BASE hwinfer) the tree before.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  models_on_card "kimi"
  per_kernel 200 --kinds kda --shapes 1x16384,8x2048 \
    --variant "scan@$D:KDA_SPANS='scan'" \
    --variant "wy1@$D:SPLIT_LAUNCH={'gdn':(2,4,32),'kda':(1,4,32)}" \
    --variant "wy4@$D:SPLIT_LAUNCH={'gdn':(2,4,32),'kda':(4,4,32)}" \
    --variant "out128@block_v_out=128"
  kda_base_tree 100
elif [ "$phase" = s34a ]; then
  # s33d's figures, plus two decode-step changes against their forms before: the greedy argmax
  # inside the decode graph (GREEDY_IN_GRAPH) and Qwen3.5's attention from the raw rows in one
  # split kernel (rms_norm_rope_paged_attention, FUSE_NEW_ROW). Strict conformance of the
  # attention ops (rows for ci/results), the overlapped-graph engine tests and the Qwen3.5 model
  # tests on the card, then Qwen3.5-0.8B's step in paired rounds (compare step_ms: the replay
  # itself grows by the argmax), then the GEMV chain's syncs against the PDL chain.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  sparse_mla_on_h200 80
  strict_rows "paged_attention or rms_norm_rope"
  HWINFER_TEST_DEVICE=cuda timeout 100 python3 -m pytest tests/engine/test_graphs.py tests/models \
    -q -p no:cacheprovider -k "qwen or (overlap and (deepseek or kimi))" > "$out/test_graphs.txt" 2>&1
  echo "== engine overlap + qwen model tests on the card rc=$?"; grep -E "passed|failed|FAILED" "$out/test_graphs.txt" | tail -6
  timeout 220 python3 scripts/bench_ablation.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
    --new 32 --groups none --repeat 2 --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False" \
    --variant "unfused@hwinfer.kernels.triton.paged_attention:FUSE_NEW_ROW=False" \
    > "$out/ablation.txt" 2> "$out/ablation.err"
  echo "== bench_ablation rc=$?"; grep "^{" "$out/ablation.txt" | cut -c1-230
  grep "rror" "$out/ablation.err" | tail -3
  timeout 90 python3 scripts/bench_decode_chain.py --quick --chain > "$out/chain.txt" 2>&1
  echo "== bench_decode_chain --chain rc=$?"; grep -v "warn\|Warn" "$out/chain.txt" | tail -16
elif [ "$phase" = s34c ]; then
  # The fused decode attention's second form (constants before the PDL wait, the new key
  # attended from registers: no barrier, no read of a row written in the launch) against the
  # two ops (s34a: the first form, with a barrier, was 7 / 14 us slower at b = 1 / 32 on an
  # H100); the greedy argmax outside the graph again (s34a: +90 us at b = 32, unexplained).
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  strict_rows "paged_attention or rms_norm_rope"
  models_on_card "qwen"
  timeout 300 python3 scripts/bench_ablation.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
    --new 32 --groups none --repeat 3 \
    --variant "unfused@hwinfer.kernels.triton.paged_attention:FUSE_NEW_ROW=False" \
    --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False" \
    > "$out/ablation.txt" 2> "$out/ablation.err"
  echo "== bench_ablation rc=$?"; grep "^{" "$out/ablation.txt" | grep -v '"round"' | cut -c1-230
  grep "rror" "$out/ablation.err" | tail -3
  sparse_mla_on_h200 80
elif [ "$phase" = s36a ]; then
  # The work of the thirty-fifth and thirty-sixth sessions, neither of which had a card (s35a,
  # prepared then, never ran): the greedy argmax as its own op (greedy_tokens: split over the
  # vocabulary, the last ticket writes the token); the sampler split over the vocabulary
  # (sample_split.py: radix select, ten launches); the lm_head storing fp32 logits itself
  # (linear's out_dtype, no cast kernel); paged attention's merge done by each row block's last
  # split (COMBINE_IN_SPLIT, off by default until this). Checks and op timings here, the model's
  # step in s36b. In order of need, each part leaving its files in $OUT as it ends: strict rows
  # of the changed ops (defaults); strict paged attention with COMBINE_IN_SPLIT on (this copy's
  # constant flipped, then put back); the card tests of the sampler (248k vocabulary: many
  # programs a row) and of the merge (many live splits); greedy_tokens and sample alone beside the reference (b =
  # 1, 32 / 1, 256); the overlapped-graph engine tests, greedy and sampled; paged attention
  # alone with and without the merge in the
  # split kernel (graph replays); the b=32 replay's kernels with the argmax inside / outside
  # (s34: 90 us longer without it, unexplained).
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  strict_rows "greedy_tokens or sample or paged_attention or linear-"
  pa=hwinfer/kernels/triton/paged_attention.py
  cp $pa /tmp/pa.py && sed -i 's/^COMBINE_IN_SPLIT = False/COMBINE_IN_SPLIT = True/' $pa
  grep -q "^COMBINE_IN_SPLIT = True" $pa && strict 100 "paged_attention" && \
    mv "$out/conformance.txt" "$out/conformance_combine.txt"
  cp /tmp/pa.py $pa
  timeout 120 python3 -m pytest tests/kernels/test_sample_split.py tests/kernels/test_paged_attention.py \
    -q -p no:cacheprovider -k cuda > "$out/kernel_tests.txt" 2>&1
  echo "== card tests: the sampler at 248k (racing tickets), the merge in the split kernel rc=$?"
  grep -E "passed|failed|FAILED|Error" "$out/kernel_tests.txt" | tail -6
  timeout 90 python3 scripts/bench_small_ops.py --quick --only greedy,sample > "$out/greedy.csv" \
    2> "$out/greedy.err"
  echo "== bench_small_ops --quick --only greedy,sample rc=$?"; grep -v "warn\|Warn" "$out/greedy.err" | tail -12
  HWINFER_TEST_DEVICE=cuda timeout 60 python3 -m pytest tests/engine/test_graphs.py -q \
    -p no:cacheprovider -k "overlap and (qwen or kimi or deepseek)" > "$out/test_graphs.txt" 2>&1
  echo "== overlapped-graph engine tests (greedy, sampled) on the card rc=$?"; grep -E "passed|failed|FAILED" "$out/test_graphs.txt" | tail -6
  timeout 90 python3 scripts/bench_paged_attention.py --quick --graph > "$out/paged.csv" 2> "$out/paged.err"
  echo "== bench_paged_attention --quick --graph rc=$?"; grep "paged_attention" "$out/paged.err" | cut -c1-120
  timeout 90 python3 scripts/profile_replay.py --batch 32 \
    --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False" > "$out/replay.jsonl" 2> "$out/replay.err"
  echo "== profile_replay rc=$?"; grep "^#" "$out/replay.err" | cut -c1-150
  tar -czf "$out/logs.tgz" -C "$out" conformance_default.txt conformance_combine.txt \
    kernel_tests.txt test_graphs.txt greedy.err paged.err replay.err && rm -f \
    "$out"/conformance_default.txt "$out"/conformance_combine.txt "$out"/kernel_tests.txt \
    "$out"/test_graphs.txt "$out"/greedy.err "$out"/paged.err "$out"/replay.err
elif [ "$phase" = s36b ]; then
  # Qwen3.5-0.8B's step (b = 1, 32) in paired rounds: the default against torch's argmax
  # (greedy_tokens' reference), the merge in the split kernel (COMBINE_IN_SPLIT), at most 8
  # splits (MAX_SPLITS; the tenth session's "fewer, longer splits at b=1") and the argmax
  # outside the graph.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  timeout 540 python3 scripts/bench_ablation.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
    --new 32 --groups none --repeat 2 --variant "torch@op:greedy_tokens=reference" \
    --variant "combine@hwinfer.kernels.triton.paged_attention:COMBINE_IN_SPLIT=True" \
    --variant "splits8@hwinfer.kernels.triton.paged_attention:MAX_SPLITS=8" \
    --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False" \
    > "$out/ablation.txt" 2> "$out/ablation.err"
  echo "== bench_ablation rc=$?"; grep "^{" "$out/ablation.txt" | cut -c1-230
  grep "rror" "$out/ablation.err" | tail -3
elif [ "$phase" = s35b ]; then
  # s34d's H200 part alone (s36a has its replay profile): sparse MLA decode (never timed on an
  # H200), Qwen3.5-0.8B whole against the roofline, GDN / KDA 1 x 16k per kernel beside fla
  # (carry .whl). On an H100 only the Qwen3.5 figures.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  sparse_mla_on_h200 80
  timeout 100 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
    --new 64 --no-hf --csv "$out/model_qwen.csv" > "$out/model_qwen.txt" 2>&1
  echo "== Qwen3.5-0.8B rc=$?"; grep "^{\|Error\|roofline" "$out/model_qwen.txt" | cut -c1-300 | tail -6
  if grep -q H200 "$out/gpu.txt"; then
    BENCH=bench_gdn per_kernel 100 --kinds gdn --shapes 1x16384
    BENCH=bench_kda per_kernel 130 --kinds kda --shapes 1x16384
    tar -czf "$out/bench.tgz" -C "$out" bench_gdn.csv bench_gdn.err bench_kda.csv bench_kda.err \
      && rm -f "$out"/bench_*.csv "$out"/bench_*.err
  fi
elif [ "$phase" = s34d ]; then
  # On an H200 (none came in the thirty-third / -fourth sessions until now): sparse MLA decode
  # (never timed there), Qwen3.5-0.8B whole against the roofline, GDN / KDA 1 x 16k per kernel
  # beside fla (carry .whl). On any card: the b=32 decode graph's kernels with the greedy argmax
  # inside / outside (s34a / s34c: the replay without it is 90 us longer, unexplained).
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  timeout 150 python3 scripts/profile_replay.py --batch 32 \
    --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False" > "$out/replay.jsonl" 2> "$out/replay.err"
  echo "== profile_replay rc=$?"; grep "^#" "$out/replay.err" | cut -c1-150
  if grep -q H200 "$out/gpu.txt"; then
    sparse_mla_on_h200 80
    timeout 100 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
      --new 64 --no-hf --csv "$out/model_qwen.csv" > "$out/model_qwen.txt" 2>&1
    echo "== Qwen3.5-0.8B rc=$?"; grep "^{\|Error\|roofline" "$out/model_qwen.txt" | cut -c1-300 | tail -6
    BENCH=bench_gdn per_kernel 100 --kinds gdn --shapes 1x16384
    BENCH=bench_kda per_kernel 130 --kinds kda --shapes 1x16384
    tar -czf "$out/bench.tgz" -C "$out" bench_gdn.csv bench_gdn.err bench_kda.csv bench_kda.err \
      && rm -f "$out"/bench_*.csv "$out"/bench_*.err
  fi
elif [ "$phase" = s34b ]; then
  # s33a's chunked GDN / KDA part alone (it ran past 600 s with the model parts): strict gdn +
  # kda rows, then each kind per kernel beside fla (carry .whl) at 1 x 16k and 8 x 2k.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  strict_rows "gdn_chunked or kda_chunked"
  BENCH=bench_gdn per_kernel 180 --kinds gdn --shapes 1x16384,8x2048
  BENCH=bench_kda per_kernel 240 --kinds kda --shapes 1x16384,8x2048
  tar -czf "$out/bench.tgz" -C "$out" bench_gdn.csv bench_gdn.err bench_kda.csv bench_kda.err \
    conformance_default.txt && rm -f "$out"/bench_*.csv "$out"/bench_*.err "$out"/conformance_default.txt
elif [ "$phase" = s33a ]; then
  # s32c's forms on by default (the decay loaded ahead, GDN's output stage on q's raw rows and
  # fla's span differences, KDA's _wu_kernel in 64-channel blocks, the state rule's 7/8 fill):
  # strict gdn + kda rows; the Qwen3.5 / Kimi model tests on the card; GDN and KDA per kernel
  # beside fla (carry .whl) at 1 x 16k and 8 x 2k, with the forms they replaced as variants;
  # Qwen3.5-0.8B whole (prefill / decode, b = 1, 32); on an H200 the sparse MLA decode timings.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  models_on_card "qwen or kimi"
  BENCH=bench_gdn per_kernel 150 --kinds gdn --shapes 1x16384,8x2048 \
    --variant "scan@$D:GDN_SPAN='scan'"
  BENCH=bench_kda per_kernel 220 --kinds kda --shapes 1x16384,8x2048 \
    --variant "bv16@block_v=16" --variant "wu32@$D:SPLIT_LAUNCH={'gdn': (2, 4, 32), 'kda': (2, 4, 32)}"
  timeout 150 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 \
    --new 64 --no-hf --csv "$out/model_qwen.csv" > "$out/model_qwen.txt" 2>&1
  echo "== Qwen3.5-0.8B rc=$?"; grep "^{\|Error\|tok/s" "$out/model_qwen.txt" | cut -c1-260 | tail -6
  tar -czf "$out/bench.tgz" -C "$out" bench_gdn.csv bench_gdn.err bench_kda.csv bench_kda.err \
    conformance_default.txt models.txt model_qwen.csv model_qwen.txt && \
    rm -f "$out"/bench_*.csv "$out"/bench_*.err "$out"/conformance_default.txt "$out"/model*
  sparse_mla_on_h200 90
elif [ "$phase" = s32c ]; then
  # Prepared after the thirty-second session's device time. The state step's decay loaded a
  # step ahead (STATE_DECAY_AHEAD: Triton leaves it the step's one unpipelined load) and GDN's
  # output stage on q's raw rows (GDN_OUT_RAW_Q), both turned on in the call's copy: strict
  # gdn + kda rows; GDN (1 x 16k, 8 x 2k) per kernel against each off, the state step at 32
  # channels, fla's span differences, _wu_kernel in 64-channel blocks (wu64: measured slower
  # with X in fp32, twelfth session); KDA likewise for the decay and wu64; then Nsight Compute on both
  # state kernels (ours as run, fla's h kernel), packed in ncu.tgz; on an H200 the sparse MLA
  # decode timings, never taken there. (Cut from the end when the call runs out of time.)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  sed -i 's/^STATE_DECAY_AHEAD = False$/STATE_DECAY_AHEAD = True/;
          s/^GDN_OUT_RAW_Q = False$/GDN_OUT_RAW_Q = True/' hwinfer/kernels/triton/delta_chunk.py
  grep -E "^(STATE_DECAY_AHEAD|GDN_OUT_RAW_Q) = " hwinfer/kernels/triton/delta_chunk.py
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  BENCH=bench_gdn per_kernel 150 --kinds gdn --shapes 1x16384,8x2048 --no-fla \
    --variant "noahead@$D:STATE_DECAY_AHEAD=False" --variant "norawq@$D:GDN_OUT_RAW_Q=False" \
    --variant "rawq64@block_v_out=64" --variant "diff@$D:GDN_SPAN='diff'" \
    --variant "bv32@block_v=32" --variant "wu64@$D:SPLIT_LAUNCH={'gdn': (2, 4, 64), 'kda': (2, 4, 64)}"
  BENCH=bench_kda per_kernel 100 --kinds kda --shapes 1x16384,8x2048 --no-fla \
    --variant "noahead@$D:STATE_DECAY_AHEAD=False" --variant "bv32@block_v=32" \
    --variant "wu64@$D:SPLIT_LAUNCH={'gdn': (2, 4, 64), 'kda': (2, 4, 64)}"
  # (the device tool returns only a few files: the benchmarks' in one archive)
  tar -czf "$out/bench.tgz" -C "$out" bench_gdn.csv bench_gdn.err bench_kda.csv bench_kda.err \
    conformance_default.txt && rm -f "$out"/bench_*.csv "$out"/bench_*.err "$out/conformance_default.txt"
  ncu_state gdn kda
  sparse_mla_on_h200 90
elif [ "$phase" = s32b ]; then
  # The state kernel's launch rule from s32a (value block by the grid, no manual prefetch, 2 / 3
  # stages) against the launches before it (old16 / old32: GDN 1 x 16k took 16 channels, the
  # rest 32; prefetch on one-wave grids, 2 stages): strict gdn + kda rows, GDN and KDA at 1 x 16k
  # and 8 x 2k per kernel, fla beside KDA 8 x 2k.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  old=(--variant "old16@block_v=16;$D:STATE_PREFETCH=None;$D:STATE_LAUNCH=(4,2)"
       --variant "old32@block_v=32;$D:STATE_PREFETCH=None;$D:STATE_LAUNCH=(4,2)")
  BENCH=bench_gdn per_kernel 120 --kinds gdn --shapes 1x16384,8x2048 --no-fla "${old[@]}"
  BENCH=bench_kda per_kernel 200 --kinds kda --shapes 8x2048,1x16384 "${old[@]}" \
    --variant "s64w4s3@block_v=64;$D:STATE_LAUNCH=(4,3)"
elif [ "$phase" = s32a ]; then
  # After s31a (the three forms on by default): the state kernel's launch (value block, warps,
  # stages, no manual prefetch) for GDN and KDA against fla side by side per kernel; then Nsight
  # Compute on both state kernels (ours, fla's h kernel) at 1 x 16k: warp states, the SASS
  # lines' stall samples (ncu_*_sass.csv).
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  gv=()  # the state kernel's launches, BV:warps:stages, each without the manual prefetch
  for l in ${STATE_SWEEP:-16:4:3 16:2:3 32:4:3 32:2:3 32:4:2 64:4:3 64:4:2}; do
    IFS=: read -r bv w st <<< "$l"
    gv+=(--variant "s${bv}w${w}s${st}@block_v=$bv;$D:STATE_PREFETCH=False;$D:STATE_LAUNCH=($w,$st)")
  done
  BENCH=bench_gdn per_kernel 200 --kinds gdn --shapes 1x16384,8x2048 "${gv[@]}"
  BENCH=bench_kda per_kernel 200 --kinds kda --shapes 1x16384 "${gv[@]}"
  ncu_state gdn kda
elif [ "$phase" = s31a ]; then
  # Prepared, not run (the thirty-first session got no card). X handed from the WY kernel to
  # _wu_kernel in bf16 with bf16 products there (X_16BIT), GDN's _wu_kernel on the scaled X
  # against the raw rows (GDN_WU_RAW "bf16"; "split"; None the thirtieth session's tf32 rows)
  # and KDA's output stage on q e^c (KDA_OUT_QG), all three turned on below: strict gdn + kda rows; KDA 1 x 16k per kernel with the output
  # stage on q and the tile cumsums (noqg), X in fp32, the output kernel at 8 warps or in
  # 64-channel key blocks (outbk64: its loads pipelined, 162 registers against 168), the state
  # kernel without its manual prefetch (nopf: Triton then pipelines its loads, see
  # _state_kernel); GDN per kernel with X in fp32 and tf32 rows (x32: the s30c form), GDN_WU_RAW
  # "split", the state stage in 32-channel blocks, without the prefetch at 2 / 3 stages; the
  # Qwen3.5 / Kimi model tests on the card; sparse MLA on an H200. (What runs out of the call's
  # time is cut from the end.)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  # The three forms are off in the repo until timed: on in this call's copy of the tree, so the
  # strict conformance and model tests run them and the variants time the forms before.
  sed -i 's/^X_16BIT = False$/X_16BIT = True/; s/^GDN_WU_RAW = None$/GDN_WU_RAW = "bf16"/;
          s/^KDA_OUT_QG = False$/KDA_OUT_QG = True/' hwinfer/kernels/triton/delta_chunk.py
  grep -E "^(X_16BIT|GDN_WU_RAW|KDA_OUT_QG) = " hwinfer/kernels/triton/delta_chunk.py | tee "$out/tree.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  BENCH=bench_kda per_kernel 120 --kinds kda --shapes 1x16384 --no-fla \
    --variant "noqg@$D:KDA_OUT_QG=False" --variant "x32@$D:X_16BIT=False" \
    --variant "out8@$D:OUT_LAUNCH=(8,None)" --variant "outbk64@block_k_out=64" \
    --variant "nopf@$D:STATE_PREFETCH=False"
  BENCH=bench_gdn per_kernel 130 --kinds gdn --shapes 1x16384,8x2048 --no-fla \
    --variant "x32@$D:X_16BIT=False;$D:GDN_WU_RAW=None" \
    --variant "split@$D:GDN_WU_RAW='split'" --variant "bv32@block_v=32" \
    --variant "nopf@$D:STATE_PREFETCH=False" \
    --variant "nopf3@$D:STATE_PREFETCH=False;$D:STATE_LAUNCH=(4,3)"
  models_on_card "qwen or kimi"
  sparse_mla_on_h200 90
elif [ "$phase" = s30c ]; then
  # After s30b: GDN's state kernel with the row scales prefetched with the keys (s30b loaded
  # them in the step: 345 -> 420 us at 1 x 16k): strict gdn, GDN per kernel beside the decayed
  # keys' form (kgrows).
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked"
  BENCH=bench_gdn per_kernel 150 --kinds gdn --shapes 1x16384,8x2048 --no-fla \
    --variant "kgrows@$D:GDN_STATE_RAW_K=False"
elif [ "$phase" = s30b ]; then
  # GDN's state stage on the keys as stored with row scales (GDN_STATE_RAW_K) and u in bf16
  # (U_16BIT), both new defaults: strict gdn + kda rows; GDN per kernel beside the decayed keys'
  # form (kgrows), fp32 u (u32), _wu_kernel at 8 warps, fla (carry .whl); KDA 1 x 16k per
  # kernel with fp32 u and the diagonal kernel's register cap at 96; sparse MLA on an H200.
  # (Ran at 1797a11; DIAG_MAXNREG, measured slower here, is gone since.)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  BENCH=bench_gdn per_kernel 190 --kinds gdn --shapes 1x16384,8x2048 \
    --variant "kgrows@$D:GDN_STATE_RAW_K=False" --variant "u32@$D:U_16BIT=False" \
    --variant "wu8@$D:SPLIT_LAUNCH={'gdn':(2,8,32),'kda':(2,4,32)}"
  BENCH=bench_kda per_kernel 130 --kinds kda --shapes 1x16384 --no-fla \
    --variant "u32@$D:U_16BIT=False" --variant "reg96@$D:DIAG_MAXNREG=96"
  sparse_mla_on_h200 90
elif [ "$phase" = s29c ]; then
  # After s29b: the diagonal loop's fused decay update (no rows fetched ahead), the state grid
  # with value blocks first by default (its old order as a variant, for GDN 8 x 2k): strict
  # gdn + kda rows, the Qwen3.5 / Kimi model tests, per kernel; sparse MLA on an H200.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "gdn_chunked or kda_chunked"
  models_on_card "qwen or kimi"
  per_kernel 150 --kinds kda,gdn --shapes 1x16384,8x2048 --no-fla \
    --variant "heads1st@$D:STATE_VB_FIRST=False"
  sparse_mla_on_h200 120
elif [ "$phase" = s29b ]; then
  # KDA's diagonal kernel with the rows in the tiles' layout (8 barriers a row, not 18): strict
  # kda rows, GDN / KDA per kernel beside fla with DIAG_AHEAD=1 and STATE_VB_FIRST as variants,
  # the tree before (.whl/base.tar: git archive BASE hwinfer), sparse MLA on an H200.
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  D=hwinfer.kernels.triton.delta_chunk
  strict_rows "kda_chunked"
  per_kernel 240 --kinds kda,gdn --shapes 1x16384,8x2048 \
    --variant "ahead1@$D:DIAG_AHEAD=1" \
    --variant "vbf@$D:STATE_VB_FIRST=True"
  # GDN's state kernel at 1 x 16k (128 programs of 16 channels, next chunk prefetched): where
  # its steps' time goes (no prefetch at 2, 3, 4 stages; 32 channels at 8 warps)
  timeout 90 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown --variant "nopf@$D:STATE_PREFETCH=False" --variant "bv32@block_v=32" \
    --variant "nopf3@$D:STATE_PREFETCH=False;$D:STATE_LAUNCH=(4,3)" --variant "nopf4@$D:STATE_PREFETCH=False;$D:STATE_LAUNCH=(4,4)" \
    > "$out/bench_gdn_state.csv" 2> "$out/bench_gdn_state.err"
  echo "== gdn state variants rc=$?"; grep "triton\|#   " "$out/bench_gdn_state.err" | grep "state\|triton " | cut -c1-150 | head -20
  kda_base_tree 80
  sparse_mla_on_h200 120
elif [ "$phase" = s25b ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
  for ws in 0 1; do
    HWINFER_SPARSE_MLA_WS_FP8=$ws timeout 170 python3 scripts/bench_model.py --preset deepseek-v4-flash \
      --layers 4 --batch 1,32 --prompt ${PROMPT:-1024} --new 16 --no-eager --no-hf --kv-format fp8 \
      --csv "$out/model.csv" > "$out/model_v4_fp8_ws$ws.txt" 2>&1
    echo "== V4 fp8 cache, Gluon FP8 kernel=$ws rc=$?"; grep "^{\|Error" "$out/model_v4_fp8_ws$ws.txt" | cut -c1-300 | tail -3
  done
  sparse_mla_on_h200 150
elif [ "$phase" = lane ]; then
  # One part of the sm_90 lane ($2: I/N of the strict conformance, or bench), its CSV rows
  # appended under $OUT/results (part 0 starts it): copy them back between calls.
  part=${2:?lane wants I/N or bench}
  mkdir -p "$out/results"; cp .out/nvidia-sm90.part.csv "$out/results/nvidia-sm90.csv" 2>/dev/null
  HWINFER_COMMIT=${HWINFER_COMMIT:-$(cat "$out/commit.txt" 2>/dev/null || echo unknown)} \
    LANE_PART=$part LANE_BUDGET_S=330 LANE_QUICK=1 BENCH_TIMEOUT_S=100 HWINFER_RESULTS_DIR="$out/results" \
    HWINFER_LOG_DIR=/tmp/lane timeout 570 bash ci/lane.sh nvidia-sm90 > "$out/lane.txt" 2>&1
  echo "== lane $part rc=$?"; grep -E "^==|^!!|passed|failed" "$out/lane.txt" | cut -c1-200 | tail -30
  # the device tool brings back only a few files: the logs travel as one archive
  tar czf "$out/lane-logs.tgz" -C /tmp lane
elif [ "$phase" = profile ]; then
  # Where the time goes in the models that trail transformers: kernels of one prefill step and of
  # decode steps (eager and graphs) at batch 1 and 32, then the chunked linear attention vs fla.
  timeout 190 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --profile --profile-prompt 1024 --no-eager --csv "$out/model.csv" \
    > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error\|# profile" "$out/bench_model_kimi.txt" | tail -16
  timeout 150 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 16 --profile --profile-prompt 1024 --no-eager --no-hf --csv "$out/model.csv" \
    > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error\|# profile" "$out/bench_model_dsv4.txt" | tail -16
  timeout 180 python3 scripts/bench_delta_chunk.py --no-variants > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "^#\|Warn\|warn" "$out/bench_delta_chunk.err" | tail -30
else
  timeout 170 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 64 \
    --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{" "$out/bench_model_qwen.txt"
  timeout 110 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | tail -8
  for bench in ${BENCHES:-bench_delta_chunk bench_sparse_mla bench_paged_attention bench_moe bench_small_ops bench_indexer}; do
    timeout 45 python3 "scripts/$bench.py" --quick > "$out/$bench.csv" 2> "$out/$bench.err"
    echo "== $bench rc=$?"; grep -v "^#\|Warn\|warn" "$out/$bench.err" | tail -14
  done
fi
