#!/usr/bin/env bash
# On the GPU machine (device tool), issue 6's checks and numbers, in two calls that each fit the
# tool's 10-minute limit:
#   bash scripts/device_issue6.sh check   # install, op table, conformance --strict (junit),
#                                         # the model oracle tests through the GPU kernels
#   bash scripts/device_issue6.sh bench   # whole-model speed vs transformers and the roofline,
#                                         # every kernel benchmark (--quick)
#   bash scripts/device_issue6.sh profile   # kernel breakdowns of Kimi-Linear / DeepSeek-V4-Flash
#                                         # (4 layers) prefill and decode, chunked GDN/KDA vs fla
#   bash scripts/device_issue6.sh moe       # MoE / mHC kernels on the card, MoE models vs
#                                         # transformers, chunked GDN/KDA per kernel and vs fla
#   bash scripts/device_issue6.sh linear    # changed kernels' conformance, models, chunked GDN
#                                         # per kernel / variants / vs fla, Kimi-Linear speed
#   bash scripts/device_issue6.sh graphs    # host syncs of graph decode, graph tests on the card,
#                                         # DeepSeek-V4 (4 layers) eager vs CUDA graphs
#   bash scripts/device_issue6.sh v4        # DeepSeek-V4 syncs, eager host profile, kernels;
#                                         # Kimi-Linear with graphs vs transformers
#   bash scripts/device_issue6.sh wy        # chunked GDN / KDA: conformance, per kernel, vs fla
#   bash scripts/device_issue6.sh next      # GLM-5 / HY4 graph decode on the card, indexer
#                                         # k_rows, KDA diag="product" vs "span" vs fla
#   bash scripts/device_issue6.sh mla       # sparse MLA decode tilings on every shape, prefill
#                                         # tilings, DeepSeek-V4 speed
#   bash scripts/device_issue6.sh diag      # KDA's diagonal-block kernel: conformance, vs fla,
#                                         # Kimi-Linear tests and speed
#   bash scripts/device_issue6.sh pdl       # Qwen3.5-0.8B's decode GEMV chain with / without
#                                         # PDL; chunked GDN / KDA variants vs fla
#   bash scripts/device_issue6.sh decode    # Qwen3.5-0.8B decode path (PDL GEMVs, fused norms,
#                                         # overlapped steps): tests on the card, speed
#   bash scripts/device_issue6.sh sparse    # MiniMax-M3 Triton block-sparse decode on the card,
#                                         # sparse MLA over packed FP8 caches vs bf16
#   bash scripts/device_issue6.sh fused     # the eighth session's kernels: gdn_gated_recurrent,
#                                         # device-side paged splits, FP8 sparse MLA loads;
#                                         # Qwen3.5 tests and speed, FP8-cache MLA tilings
#   bash scripts/device_issue6.sh v4fp8     # DeepSeek-V4 with packed FP8 caches (kv_format fp8):
#                                         # the packing kernel's conformance, the model tests on
#                                         # the card, 4-layer speed bf16 vs fp8
#   bash scripts/device_issue6.sh pending   # what the eighth session wrote after its device time:
#                                         # rms_norm_rope_kv_store (Qwen3.5 attention decode) and
#                                         # kv_store_fp8_ds_mla (V4 packed writes), on the card
#   bash scripts/device_issue6.sh ablate    # the ninth session: paged attention with PDL, the
#                                         # marginal cost of each kernel group in Qwen3.5's
#                                         # decode graph, DeepSeek-V4 4 layers vs transformers
#   bash scripts/device_issue6.sh variants  # chunked GDN/KDA output-stage variants vs fla, paged
#                                         # attention tilings as graph replays
#   bash scripts/device_issue6.sh final9    # the ninth session's last changes (conv epilogue state
#                                         # before the PDL wait, paged split cap) on the card
#   bash scripts/device_issue6.sh next10    # tenth session: decode GEMVs as the model runs them,
#                                         # register caps, split cap, bf16 chunked outputs
#   bash scripts/device_issue6.sh next10b   # GEMV tilings / persistent GEMV in the model
#   bash scripts/device_issue6.sh glue      # the step without its torch glue kernels
#   bash scripts/device_issue6.sh final10   # recurrent state before the PDL wait
#   bash scripts/device_issue6.sh next10c   # KDA vs fla, V4 b=32 transformers alone
#   bash scripts/device_issue6.sh s11a      # eleventh session: chunked output stage in key
#                                         # blocks, bf16 state products; recurrence tiles
#   bash scripts/device_issue6.sh s11b      # paged prefetch, attention warps, chunked stages
#   bash scripts/device_issue6.sh s11c      # raw q k^T, Qwen3.5 card tests, paired A/B rounds
#   bash scripts/device_issue6.sh s11d      # final step figures (prefetch removed), split warps
#   bash scripts/device_issue6.sh s11e      # strict paged suite with 8 split warps
#   bash scripts/device_issue6.sh s12a      # V4 / Gemma 4 / Kimi glue removal on the card:
#                                         # strict suites, model + graph tests, V4 step
#   bash scripts/device_issue6.sh s12b      # Kimi-Linear step, KDA vs fla
#   bash scripts/device_issue6.sh s12c      # Nsight Compute on chunked KDA / GDN, sparse MLA,
#                                         # the decode GEMV (scripts/ncu_targets.py)
#   bash scripts/device_issue6.sh s12d      # the split WY stage and KDA's diagonal by levels
#   bash scripts/device_issue6.sh s12e      # the split WY stage's chosen launches
#   bash scripts/device_issue6.sh s13       # strict suites, the state stage's split products
#   bash scripts/device_issue6.sh s13c      # Kimi / V4 / GLM-5 / HY4 card tests, model steps
#   bash scripts/device_issue6.sh s13d      # device-built chunk tables: strict, calls, prefill
#   bash scripts/device_issue6.sh s13e      # host syncs in prefill, a profiled Qwen3.5 prefill
#   bash scripts/device_issue6.sh s13a      # (prepared) strict suites + Kimi card tests + step
#   bash scripts/device_issue6.sh s13b      # (prepared) chunked stages, final defaults vs forms
#   bash scripts/device_issue6.sh s14a      # (prepared) prefill without host syncs: find_syncs
#                                         # --prefill, card tests, prefill speed, host profile
#   bash scripts/device_issue6.sh s14b      # (prepared) GDN's WY forms (x4 solve, raw keys),
#                                         # KDA's diagonal by levels (3xTF32) and by pairs
#   bash scripts/device_issue6.sh s15a      # the card tests of s14a, the GDN forms with the fused
#                                         # output stage (FUSED_OUT), strict conformance of all
#   bash scripts/device_issue6.sh s15b      # the rest of s14a / s14b: KDA forms, prefill syncs,
#                                         # prefill host profile, model figures
#   bash scripts/device_issue6.sh s15c      # strict chunked conformance, Qwen3.5 card tests,
#                                         # pageable host copies in prefill, Qwen3.5 with GDN's
#                                         # new WY defaults and strided q / k / v
#   bash scripts/device_issue6.sh s17a      # s16a's card tests and syncs (the strict suites
#                                         # run in the sm_90 lane: s17lane)
#   bash scripts/device_issue6.sh lane 0/3  # one part of the sm_90 lane (0/3, 1/3, 2/3, bench):
#                                         # copy $OUT/results/nvidia-sm90.csv to
#                                         # .out/nvidia-sm90.part.csv between parts (carry it)
#   bash scripts/device_issue6.sh s17lane   # bash ci/lane.sh nvidia-sm90, quick benchmarks,
#                                         # rows into $OUT/results
#   bash scripts/device_issue6.sh s18a      # (ran at 37654c6, code removed) the decode GEMVs' L2 prefetch
#   bash scripts/device_issue6.sh s19a      # (ran) KDA's diagonal loop fetching a row ahead, strict; s18c
#   bash scripts/device_issue6.sh s19b      # (ran) the loop 0 / 1 / 2 rows ahead, GDN + KDA beside fla,
#                                         # Gemma 4 with and without prefill graphs
#   bash scripts/device_issue6.sh s19c      # (ran) Gemma 4's 512-wide attention strict, its prefill-graph
#                                         # tests, the model with / without prefill graphs
#   bash scripts/device_issue6.sh s20a      # V4 / K3 prefill-graph tests on the card, strict
#                                         # attention, V4-Flash 4 layers with / without graphs
#   bash scripts/device_issue6.sh s18c      # Kimi-K3's prefill profile, Gemma 4 prefill with graphs
#   bash scripts/device_issue6.sh s20b      # the MoE GEMMs' K step forms vs 1137b7c (carry
#                                         # .out/base: git archive 1137b7c hwinfer)
#   bash scripts/device_issue6.sh s20c      # K3 latent MoE prefill tiles, K3 4 layers
#   bash scripts/device_issue6.sh s20d      # the expert FFN's decode form (moe_gemv.py) vs the
#                                         # tiles, tiles / pipelining depth, K3 / V4 decode
#   bash scripts/device_issue6.sh s21a      # (ran at 26c179d) the MoE defaults flipped in the 21st session (decode
#                                         # form, swapped tiles) against the old ones: strict,
#                                         # bf16 / FP8 / FP4 experts and K3's latent MoE 1-4,096
#                                         # tokens, middle tiles; K3 / V4-Flash / Kimi-Linear steps
#   bash scripts/device_issue6.sh s21e      # GDN's output products in bf16; KDA's state walk forms
#   bash scripts/device_issue6.sh s22a      # the warp-specialised Gluon sparse MLA decode: card
#                                         # test, strict conformance, V4 shapes vs the Triton kernel
#   bash scripts/device_issue6.sh s22b      # DeepSeek-V4-Flash 4 layers, Gluon sparse MLA off / on
#   bash scripts/device_issue6.sh s21b      # (ran at 26c179d) KDA's output stage inside the state
#                                         # kernel: 1.2x slower, removed; the phase now refuses
#   bash scripts/device_issue6.sh s20e      # KDA's WY kernel in 16-channel blocks, 4 / 8 warps
#   bash scripts/device_issue6.sh s17b      # strict suites of the new ops, Triton varlen attention
#                                         # vs SDPA, Qwen3.5 with prefill graphs
#   bash scripts/device_issue6.sh s17c      # Kimi-K3 and Kimi-Linear steps
#   bash scripts/device_issue6.sh s16a      # (prepared) the sixteenth session's work, not on a
#                                         # card yet: strict conformance of its ops, card tests
#                                         # of the models it touches, prefill syncs
#   bash scripts/device_issue6.sh s16b      # (prepared) Qwen3.5, Kimi-Linear, Kimi-K3 steps
#   bash scripts/device_issue6.sh diagnose  # model oracle + CUDA-graph tests on the GPU, then
#                                         # the failures again under HWINFER_SHADOW=raise, which
#                                         # names the first op whose kernel leaves its reference
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

qwen_tests() {  # Qwen3.5 tests on the card (graphs, overlapped steps), within $1 seconds
  HWINFER_TEST_DEVICE=cuda timeout "$1" python3 -m pytest tests/models tests/engine/test_graphs.py -q \
    -p no:cacheprovider -k "qwen or overlap" -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
}

D=hwinfer.kernels.triton.delta_chunk
prefill_syncs() {  # find_syncs --prefill over six architectures (expect 0 sync sites)
  timeout 120 python3 scripts/find_syncs.py qwen3_5 kimi_linear deepseek_v4 glm_moe_dsa gemma4 \
    minimax_m3 --prefill > "$out/syncs_prefill.txt" 2>&1
  echo "== find_syncs --prefill rc=$?"; grep -v "Warn\|warn" "$out/syncs_prefill.txt" | cut -c1-240 | head -30
}

prefill_tests() {  # card tests of the models the sync-free prefill touched, graphs included
  # (decode stays sync-free if the graph tests below pass: a capture fails at the first sync)
  HWINFER_TEST_DEVICE=cuda timeout 170 python3 -m pytest tests/models tests/engine/test_graphs.py \
    tests/engine/test_batch.py -q -p no:cacheprovider -k "qwen or kimi or deepseek or minimax or gemma or batch" \
    -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
}

qwen_prefill_profile() {  # Qwen3.5 b=1 with the prefill host profile
  timeout 90 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1 --prompt 1024 --new 16 \
    --no-eager --no-hf --profile --profile-prompt 1024 --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{\|Error\|# profile\|# host profile" "$out/bench_model_qwen.txt" | cut -c1-200 | tail -10
  grep -A 30 "# host profile prefill 1" "$out/bench_model_qwen.txt" | cut -c1-150 | head -34
}

model_figures() {  # Qwen3.5 b=32, Kimi-Linear / V4-Flash 4 layers b=1,32
  timeout 70 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 32 --prompt 1024 --new 16 \
    --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_qwen32.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_qwen32.txt" | cut -c1-300 | tail -2
  for preset in kimi-linear-48b-a3b deepseek-v4-flash; do
    timeout 60 python3 scripts/bench_model.py --preset $preset --layers 4 --batch 1,32 --prompt 1024 \
      --new 16 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_$preset.txt" 2>&1
    grep "^{\|Error" "$out/bench_model_$preset.txt" | cut -c1-300 | tail -3
  done
}

gdn_forms() {  # GDN forms per kernel against the default, fla beside them
  # (s15a timed x4 / raw keys / the fused output stage; the first two are the default now, the
  # fused stage was removed: the old forms are the variants here)
  timeout 200 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown --variant "x1@$D:GDN_SOLVE='x1'" --variant "norm_k@$D:GDN_RAW_K=False" \
    --variant "old@$D:GDN_SOLVE='x1';$D:GDN_RAW_K=False" \
    > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|Memcpy" \
    "$out/bench_delta_chunk_gdn.err" | grep "triton\|fla\|_kernel" | cut -c1-150 | head -40
}

kda_forms() {  # KDA per kernel (no fla), its WY kernel at 8 warps beside the default
  # (s15b also timed the diagonal blocks by levels / pairs and the fused output stage: slower,
  # removed)
  timeout 120 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown --variant "wy8@$D:SPLIT_LAUNCH={'gdn': (2, 4, 32), 'kda': (8, 4, 32)}" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep "triton\|_kernel" "$out/bench_delta_chunk_kda.err" \
    | grep -v "Warn\|warn" | cut -c1-150 | head -24
}

gemma_graphs() {  # Gemma 4 prefill in CUDA graphs (ring store without host lengths), 6 layers
  for flag in "" "--without-prefill-graphs"; do
    timeout 100 python3 scripts/bench_model.py --preset gemma-4-12b --layers 6 --batch 1,8 --prompt 1024 \
      --new 16 --no-eager --no-hf $flag --csv "$out/model.csv" > "$out/bench_model_gemma$flag.txt" 2>&1
    echo "== gemma4 $flag rc=$?"; grep "^{\|Error" "$out/bench_model_gemma$flag.txt" | cut -c1-400 | tail -3
  done
}

ahead_strict() {  # strict KDA chunked conformance with the diagonal loop 2 rows ahead, within $1 s
  timeout "$1" python3 -c "import sys, pytest, $D as t; t.DIAG_AHEAD = 2; \
sys.exit(pytest.main(['tests/conformance', '--backend', 'nvidia', '--strict', '-q', \
'-p', 'no:cacheprovider', '-k', 'test_impl_matches_reference and triton and kda_chunked']))" \
    > "$out/conformance_ahead.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_ahead.txt" | tail -4
}

strict_forms() {  # strict chunked conformance with GDN's old WY forms (x1 solve, normalised keys)
  timeout 130 python3 -c "import sys, pytest, $D as t; t.GDN_SOLVE = 'x1'; t.GDN_RAW_K = False; \
sys.exit(pytest.main(['tests/conformance', '--backend', 'nvidia', '--strict', '-q', \
'-p', 'no:cacheprovider', '-k', 'test_impl_matches_reference and triton and (gdn_chunked or kda_chunked)']))" \
    > "$out/conformance_forms.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_forms.txt" | tail -6
}

ablation() {  # Qwen3.5's decode step by kernel group (scripts/bench_ablation.py) within $1 s
  local secs=$1; shift
  timeout "$secs" python3 scripts/bench_ablation.py --batch 1,32 --prompt 1024 --new 32 "$@" \
    > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; cat "$out/ablation.jsonl"; grep -i "error" "$out/ablation.err" | tail -3
}

qwen_on_card() {  # Qwen3.5 tests on the card, then its decode speed
  qwen_tests 150
  timeout 150 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 64 \
    --no-hf --no-eager --profile --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{\|Error\|# profile" "$out/bench_model_qwen.txt" | tail -6
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
elif [ "$phase" = moe ]; then
  # The MoE / mHC kernels on the card (their split bf16 dots only run on a GPU), then the MoE
  # models against transformers, the chunked linear attention per kernel and vs fla.
  timeout 120 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "moe or mhc or ihc" > "$out/conformance_moe.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_moe.txt" | tail -12
  HWINFER_TEST_DEVICE=cuda timeout 100 python3 -m pytest tests/models -q -p no:cacheprovider \
    -k "kimi or deepseek_v4 or moe" > "$out/models_moe.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/models_moe.txt" | tail -12
  timeout 150 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | tail -8
  timeout 120 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 16 --profile --profile-prompt 1024 --no-eager --no-hf --csv "$out/model.csv" \
    > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error\|# profile" "$out/bench_model_dsv4.txt" | tail -8
  timeout 100 python3 scripts/bench_delta_chunk.py --no-variants --shapes 1x16384 --breakdown \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk.err" | tail -40
  timeout 45 python3 scripts/bench_moe.py --quick > "$out/bench_moe.csv" 2> "$out/bench_moe.err"
  echo "== bench_moe rc=$?"; grep -v "^#\|Warn\|warn" "$out/bench_moe.err" | tail -14
elif [ "$phase" = linear ]; then
  # The changed kernels on the card (MoE, mHC, chunked linear attention), the models through
  # them, chunked GDN per kernel and vs fla with the block-size variants, Kimi-Linear's speed.
  timeout 150 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "moe or mhc or ihc or chunked or recurrent" > "$out/conformance_changed.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_changed.txt" | tail -12
  HWINFER_TEST_DEVICE=cuda timeout 130 python3 -m pytest tests/models -q -p no:cacheprovider \
    -k "kimi or deepseek_v4 or moe or qwen" > "$out/models_changed.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/models_changed.txt" | tail -12
  timeout 130 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048,1x4096 \
    --breakdown > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk.err" | tail -45
  timeout 120 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | tail -8
elif [ "$phase" = graphs ]; then
  # DeepSeek-V4's decode under CUDA graphs: every host sync of the fixed-size step (all models
  # that declare graph_decode), the graph tests with real capture and replay, then the speed of
  # 4 real-size layers eager vs graphs.
  timeout 200 python3 scripts/find_syncs.py deepseek_v4 kimi_linear qwen3_5 gemma4 > "$out/syncs.txt" 2>&1
  echo "== find_syncs rc=$?"; grep -v "Warn\|warn" "$out/syncs.txt" | tail -30
  HWINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest tests/engine/test_graphs.py -q -p no:cacheprovider \
    -rf --tb=short > "$out/graphs_tests.txt" 2>&1
  grep -E "^FAILED|passed|failed|Error" "$out/graphs_tests.txt" | cut -c1-600 | tail -12
  timeout 200 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-hf --csv "$out/model.csv" > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error\|graphs" "$out/bench_model_dsv4.txt" | tail -10
elif [ "$phase" = v4 ]; then
  # DeepSeek-V4 decode: no host syncs left, where eager decode's host time goes (cProfile) and
  # its kernels eager vs graphs; Kimi-Linear's speed with graphs vs transformers.
  timeout 120 python3 scripts/find_syncs.py deepseek_v4 > "$out/syncs.txt" 2>&1
  echo "== find_syncs rc=$?"; grep -v "Warn\|warn" "$out/syncs.txt" | tail -10
  timeout 200 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1 \
    --prompt 1024 --new 32 --profile --profile-prompt 1024 --no-hf --csv "$out/model.csv" \
    > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error\|# profile\|# host" "$out/bench_model_dsv4.txt" | tail -10
  grep -A30 "# host profile" "$out/bench_model_dsv4.txt" | cut -c1-170 | head -32
  timeout 150 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | tail -8
elif [ "$phase" = wy ]; then
  # The chunked kernels after a change: strict conformance on the card, then GDN and KDA per
  # kernel (registers, spills) and against fla at 1 x 16k, 8 x 2k and 1 x 4k.
  timeout 100 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "chunked" > "$out/conformance_chunked.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_chunked.txt" | tail -8
  timeout 330 python3 scripts/bench_delta_chunk.py --no-variants --shapes 1x16384,8x2048,1x4096 \
    --breakdown > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk.err" | tail -60
elif [ "$phase" = next ]; then
  # What the fifth session could not run for lack of device time: the graph decode of GLM-5 /
  # HY4 (syncs, real capture), the indexer's k_rows form, the compressor step's in-place form
  # (V4 decode), KDA's product-form diagonal vs fla; then V4 decode speed again.
  timeout 120 python3 scripts/find_syncs.py glm_moe_dsa hy_v4 deepseek_v4 > "$out/syncs.txt" 2>&1
  echo "== find_syncs rc=$?"; grep -v "Warn\|warn" "$out/syncs.txt" | tail -12
  HWINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest tests/engine/test_graphs.py -q -p no:cacheprovider \
    -rf --tb=short > "$out/graphs_tests.txt" 2>&1
  grep -E "^FAILED|passed|failed|Error" "$out/graphs_tests.txt" | cut -c1-600 | tail -12
  timeout 100 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "lightning_indexer or chunked or kv_compress_step" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance.txt" | tail -8
  timeout 200 python3 scripts/bench_delta_chunk.py --no-variants --kinds kda --shapes 1x16384,1x4096 \
    --breakdown > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk.err" | tail -40
  timeout 150 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-hf --no-eager --csv "$out/model.csv" > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4.txt" | tail -4
elif [ "$phase" = mla ]; then
  # Sparse MLA decode: 10 tilings around the CUDA default on every decode shape (CUDA-graph
  # timed), each compiled variant's registers and spills; prefill tilings; V4 model speed.
  timeout 250 python3 scripts/bench_sparse_mla.py --sweep-focused > "$out/bench_sparse_mla_sweep.csv" \
    2> "$out/bench_sparse_mla_sweep.err"
  echo "== sweep rc=$?"; grep "^#" "$out/bench_sparse_mla_sweep.err" | cut -c1-60 | sort | uniq -c | tail -12
  python3 - "$out/bench_sparse_mla_sweep.csv" <<'PY'
import csv, sys
best = {}
for r in csv.DictReader(open(sys.argv[1])):
    if r["impl"] != "torch":
        k = r["shape"]
        if k not in best or float(r["us"]) < float(best[k]["us"]):
            best[k] = r
        if r["impl"] == "triton":
            print(f"default {k:<28} {r['us']:>9} us {r['pct_of_peak']:>5}%")
for k, r in best.items():
    print(f"best    {k:<28} {r['us']:>9} us {r['pct_of_peak']:>5}%  {r['impl']}")
PY
  timeout 120 python3 scripts/bench_sparse_mla.py --only prefill > "$out/bench_sparse_mla_prefill.csv" \
    2> "$out/bench_sparse_mla_prefill.err"
  echo "== prefill rc=$?"; grep -v "Warn\|warn" "$out/bench_sparse_mla_prefill.err" | cut -c1-130 | tail -24
  timeout 150 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-hf --no-eager --csv "$out/model.csv" > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4.txt" | tail -4
elif [ "$phase" = diag ]; then
  # KDA's diagonal-block kernel, now always used: conformance of the chunked kernels, KDA and
  # GDN per kernel against fla, Kimi-Linear's oracle tests and speed.
  timeout 100 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "kda_chunked or gdn_chunked" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance.txt" | tail -6
  timeout 150 python3 scripts/bench_delta_chunk.py --no-variants --no-torch --shapes 1x4096,1x16384,8x2048 \
    --breakdown > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|at::native\|Memcpy" "$out/bench_delta_chunk.err" | tail -44
  HWINFER_TEST_DEVICE=cuda timeout 80 python3 -m pytest tests/models -q -p no:cacheprovider -k "kimi" \
    > "$out/models.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/models.txt" | cut -c1-300 | tail -6
  timeout 100 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | tail -4
elif [ "$phase" = pdl ]; then
  # The decode weight stream (97 GEMVs of Qwen3.5-0.8B) with the whole-row GEMV, with and
  # without programmatic dependent launch; chunked GDN / KDA with the channel-blocked WY stage
  # as the default: conformance on the card, value-block / warp variants, per kernel, vs fla.
  timeout 150 python3 scripts/bench_decode_chain.py > "$out/decode_chain.txt" 2>&1
  echo "== decode_chain rc=$?"; grep -v "Warn\|warn" "$out/decode_chain.txt" | tail -16
  timeout 90 python3 scripts/bench_decode_chain.py --norms > "$out/decode_chain_norms.txt" 2>&1
  echo "== decode_chain --norms rc=$?"; grep -v "Warn\|warn" "$out/decode_chain_norms.txt" | tail -16
  timeout 80 python3 -m pytest tests/conformance --backend nvidia --strict -q -p no:cacheprovider \
    -k "chunked" > "$out/conformance.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance.txt" | tail -4
  for kind in gdn kda; do
    timeout 120 python3 scripts/bench_delta_chunk.py --no-torch --kinds $kind --shapes 1x16384,8x2048,1x4096 \
      --breakdown > "$out/bench_delta_chunk_$kind.csv" 2> "$out/bench_delta_chunk_$kind.err"
    echo "== bench_delta_chunk $kind rc=$?"
    grep -v "Warn\|warn\|at::native\|Memcpy\|elementwise\|regs" "$out/bench_delta_chunk_$kind.err" | cut -c1-150 | tail -60
  done
elif [ "$phase" = decode ]; then
  # Qwen3.5-0.8B's decode path: the whole-row GEMV with PDL, the norm-then-project GEMVs
  # (add_rms_norm_linear, rms_norm_gated_linear), overlapped graph steps. Conformance of those
  # ops and the recurrent kernels, Qwen3.5 tests on the card (graph tests: overlapped steps vs
  # one at a time), then decode speed with and without PDL. (This session's pdl2 / pdl3 / pdl4
  # runs were this phase at three trees.)
  timeout 60 python3 -m pytest tests/kernels/test_gemv.py -q -p no:cacheprovider -k cuda > "$out/gemv_tests.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/gemv_tests.txt" | tail -2
  strict 120 "linear or recurrent or rms_norm or gated_act or conv or gdn_gate"
  qwen_on_card
  HWINFER_PDL=0 timeout 90 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1 --prompt 1024 \
    --new 64 --no-hf --no-eager > "$out/bench_model_qwen_nopdl.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_qwen_nopdl.txt" | tail -3
elif [ "$phase" = sparse ]; then
  # What the seventh session wrote after its device time, besides the decode phase: MiniMax-M3's
  # Triton block_sparse_decode (conformance, graph + oracle tests on the card) and sparse MLA
  # decode over packed FP8 caches (conformance; HCA bf16 vs fp8 cache timing).
  strict 120 "block_sparse or sparse_mla"
  HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/engine/test_graphs.py tests/models/test_minimax_m3.py \
    -q -p no:cacheprovider -k "minimax" -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  timeout 200 python3 scripts/bench_sparse_mla.py --only hca > "$out/bench_sparse_mla.csv" 2> "$out/bench_sparse_mla.err"
  echo "== bench_sparse_mla rc=$?"; grep -v "Warn\|warn" "$out/bench_sparse_mla.err" | tail -20
elif [ "$phase" = fused ]; then
  # gdn_gated_recurrent (gates inside the recurrence), paged decode splits sized on the device,
  # sparse MLA over packed FP8 rows (8-byte loads, group scales, hardware e4m3): conformance on
  # the card, Qwen3.5 tests (graphs, overlap) and speed, FP8-cache sparse MLA tilings.
  strict 100 "gdn_gated or recurrent or paged or sparse_mla"
  qwen_on_card
  timeout 150 python3 scripts/bench_sparse_mla.py --sweep-focused --only fp8cache > "$out/bench_sparse_mla_fp8.csv" \
    2> "$out/bench_sparse_mla_fp8.err"
  echo "== bench_sparse_mla fp8 sweep rc=$?"; grep "triton" "$out/bench_sparse_mla_fp8.err" | cut -c1-150 | tail -40
elif [ "$phase" = v4fp8 ]; then
  strict 60 "kv_store or sparse_mla or kv_compress"
  HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/models/test_deepseek_v4_fp8_cache.py \
    tests/models/test_deepseek_v4.py -q -p no:cacheprovider -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  for fmt in bf16 fp8; do
    timeout 130 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
      --prompt 1024 --new 32 --no-hf --no-eager --kv-format $fmt --csv "$out/model.csv" \
      > "$out/bench_model_dsv4_$fmt.txt" 2>&1
    grep "^{\|Error" "$out/bench_model_dsv4_$fmt.txt" | tail -3
  done
elif [ "$phase" = pending ]; then
  # The two decode prologue / write kernels written after the eighth session's device time: strict
  # conformance, Qwen3.5 tests and speed (attention decode: 4 kernels -> 1), V4 packed caches.
  strict 80 "rms_norm_rope or kv_store or gdn_gated"
  qwen_on_card
  HWINFER_TEST_DEVICE=cuda timeout 100 python3 -m pytest tests/models/test_deepseek_v4_fp8_cache.py -q \
    -p no:cacheprovider -rf --tb=short -k "not option_validation" > "$out/tests_v4fp8.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests_v4fp8.txt" | cut -c1-300 | tail -6
  timeout 100 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-hf --no-eager --kv-format fp8 --csv "$out/model.csv" \
    > "$out/bench_model_dsv4_fp8.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4_fp8.txt" | tail -3
elif [ "$phase" = ablate ]; then
  # The ninth session: paged attention under PDL on the card, what each kernel group costs inside
  # Qwen3.5's captured decode step (stand-ins that launch nothing), DeepSeek-V4 vs transformers.
  strict 60 "paged"
  ablation 240
  timeout 240 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --csv "$out/model.csv" > "$out/bench_model_dsv4_hf.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4_hf.txt" | cut -c1-400 | tail -6
elif [ "$phase" = variants ]; then
  # The ninth session: add_rms_norm_linear_conv (GDN decode's conv as the projection's
  # epilogue) on the card, Qwen3.5's tests and its decode step by kernel group; chunked GDN /
  # KDA output-stage variants (value block 128, bf16 operands) with their errors, vs fla; paged
  # attention tilings timed as graph replays.
  strict 90 "add_rms_norm_linear or gdn_chunked or kda_chunked"
  qwen_tests 150
  ablation 150
  timeout 150 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk.err" | tail -30
  timeout 100 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_kda.err" | tail -14
  timeout 180 python3 scripts/bench_paged_attention.py --quick --sweep --graph \
    > "$out/bench_paged.csv" 2> "$out/bench_paged.err"
  echo "== bench_paged rc=$?"; grep -v "Warn\|warn" "$out/bench_paged.err" | cut -c1-120 | tail -90
elif [ "$phase" = final9 ]; then
  # The ninth session's last changes on the card: the conv epilogue's state loaded before the
  # PDL wait, the unfused form convolving in place, paged attention's split cap; Qwen3.5's
  # tests and decode step by kernel group; paged attention as graph replays.
  strict 60 "add_rms_norm_linear_conv or causal_conv1d or paged"
  qwen_tests 130
  ablation 100 --groups delta_rule,attention,non_gemv
  timeout 60 python3 scripts/bench_paged_attention.py --quick --graph > "$out/bench_paged.csv" \
    2> "$out/bench_paged.err"
  echo "== bench_paged rc=$?"; grep "triton \|sdpa" "$out/bench_paged.err" | cut -c1-120 | head -14
elif [ "$phase" = next10 ]; then
  # Tenth session, first call: the decode GEMVs as the model runs them (fused prologues and
  # epilogues, per kind and chained, tile / warp sweep) and a persistent candidate; the step
  # with the conv GEMV's register cap and with paged attention's split cap 16; the compiled
  # kernels' real register counts; the strict chunked suite with bf16 output products.
  G=hwinfer.kernels.triton.gemv_norm; P=hwinfer.kernels.triton.paged_attention
  timeout 150 python3 scripts/bench_decode_chain.py --quick --persistent --fused > "$out/chain.txt" 2>&1
  echo "== chain rc=$?"; grep -v "Warn\|warn" "$out/chain.txt" | tail -24
  ablation 110 --groups non_gemv --regs
  mv "$out/ablation.jsonl" "$out/ablation_default.jsonl"
  ablation 90 --groups non_gemv --set $G:CONV_MAXNREG=80   # (knob removed after this run)
  mv "$out/ablation.jsonl" "$out/ablation_maxnreg80.jsonl"
  ablation 90 --groups attention --set $P:MAX_SPLITS=16
  mv "$out/ablation.jsonl" "$out/ablation_splits16.jsonl"
  # the strict chunked cases with bf16 output products (set in the test process; the knob was
  # OUT_DOTS, for every dtype, when this ran; now OUT_DOTS_16BIT, the default)
  timeout 90 python3 -c "import hwinfer.kernels.triton.delta_chunk as d, sys, pytest; \
d.OUT_DOTS_16BIT='bf16'; sys.exit(pytest.main(['tests/conformance', '--backend', 'nvidia', '--strict', \
'-q', '-p', 'no:cacheprovider', '-k', 'gdn_chunked or kda_chunked']))" > "$out/conformance_bf16dots.txt" 2>&1
  grep -E "passed|failed|FAILED" "$out/conformance_bf16dots.txt" | tail -6
elif [ "$phase" = next10b ]; then
  # Tenth session, second call: per-kind tilings of the fused GEMVs and the persistent plain
  # GEMV, on the card (tests, strict conformance), chained, and in the model's full step.
  GN=hwinfer.kernels.triton.gemv_norm; GM=hwinfer.kernels.triton.gemv
  OLD="{'norm': (16384, 8), 'gated': (16384, 8), 'conv': (16384, 8), 'gated_norm': (16384, 8)}"
  HWINFER_TEST_DEVICE=cuda timeout 60 python3 -m pytest tests/kernels/test_gemv.py -q -p no:cacheprovider \
    > "$out/tests.txt" 2>&1; tail -1 "$out/tests.txt"
  strict 90 "add_rms_norm_linear or rms_norm_gated_linear or linear"
  timeout 110 python3 scripts/bench_decode_chain.py --quick --persistent --fused > "$out/chain.txt" 2>&1
  echo "== chain rc=$?"; grep -v "Warn\|warn" "$out/chain.txt" | tail -16
  ablation 150 --groups none --variant "old_tiling@$GN:TILING=$OLD" \
    --variant "persist3@$GM:PERSIST_PER_SM=3" --variant "persist2@$GM:PERSIST_PER_SM=2"
elif [ "$phase" = glue ]; then
  # Tenth session, third call: the decode step with its glue removed (host-computed cache rows
  # and lengths, one gather for the tokens, Triton rope tables, the first layer fused): Qwen3.5
  # tests on the card, strict rope_tables, the full step at b=1 / 32, with the fused GEMVs at
  # 32 KB x 4 warps as a variant.
  GN=hwinfer.kernels.triton.gemv_norm
  W4="{'norm': (32768, 4), 'gated': (32768, 4), 'conv': (32768, 4), 'gated_norm': (32768, 4)}"
  qwen_tests 150
  strict 60 "rope_tables"
  ablation 150 --groups non_gemv --variant "w4@$GN:TILING=$W4"
elif [ "$phase" = final10 ]; then
  # Tenth session, last call: the recurrent state loaded before the PDL wait (Qwen3.5 card
  # tests with graphs and overlapped steps, strict recurrent suite, the step).
  qwen_tests 150
  strict 60 "recurrent"
  ablation 120 --groups non_gemv
elif [ "$phase" = s11a ]; then
  # Eleventh session, first call: the chunked output stage in key-channel blocks and bf16
  # products in the state stage (GDN 1 x 16k and 8 x 2k against fla, KDA 1 x 16k), and
  # Qwen3.5's batch-1 decode step with other recurrence tiles (value channels, warps).
  D=hwinfer.kernels.triton.delta_chunk; R=hwinfer.kernels.triton.delta_rule
  V=(--variant "ob32@block_k_out=32" --variant "ob64@block_k_out=64"
     --variant "ob32_bf16@block_k_out=32;dots='bf16'"
     --variant "ob32_bvo128@block_k_out=32;block_v_out=128"
     --variant "ob64_bvo128@block_k_out=64;block_v_out=128"
     --variant "ob32_bf16_bvo128@block_k_out=32;block_v_out=128;dots='bf16'"
     --variant "sbf16@$D:STATE_DOTS='bf16'"
     --variant "ob32_allbf16@block_k_out=32;dots='bf16';$D:STATE_DOTS='bf16'")
  timeout 170 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants "${V[@]}" > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_gdn.err" | tail -24
  timeout 100 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants "${V[@]}" > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_kda.err" | tail -12
  timeout 170 python3 scripts/bench_ablation.py --batch 1 --prompt 1024 --new 32 --groups none \
    --variant "t32w1@$R:NARROW_TILE=(32, 1)" --variant "t32w2@$R:NARROW_TILE=(32, 2)" \
    --variant "t16w2@$R:NARROW_TILE=(16, 2)" --variant "t16w4@$R:NARROW_TILE=(16, 4)" \
    --variant "t32w4@$R:NARROW_TILE=(32, 4)" --variant "t8w2@$R:NARROW_TILE=(8, 2)" \
    --variant "default@$R:NARROW_TILE=(16, 1)" > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; cat "$out/ablation.jsonl" | cut -c1-200; grep -i "error\|Trace" "$out/ablation.err" | tail -5
elif [ "$phase" = s11b ]; then
  # (PREFETCH was removed after s11c: it cost the step 24 us.)
  # Eleventh session, second call: paged attention's first key tile loaded before the PDL wait
  # and the two-warp recurrence tile on the card (strict suites, Qwen3.5 card tests); the b=1
  # step with attention's warps as variants; the chunked stages' GPU time and registers.
  P=hwinfer.kernels.triton.paged_attention; N=hwinfer.kernels.triton.norm_rope
  strict 150 "paged or recurrent or rms_norm_rope or gdn_chunked or kda_chunked"
  qwen_tests 150
  timeout 200 python3 scripts/bench_ablation.py --batch 1 --prompt 1024 --new 32 --groups none \
    --variant "noprefetch@$P:PREFETCH=False" --variant "split2@$P:SPLIT_WARPS=2" \
    --variant "split8@$P:SPLIT_WARPS=8" --variant "combine1@$P:COMBINE_WARPS=1" \
    --variant "combine2@$P:COMBINE_WARPS=2" --variant "kvstore1@$N:KV_STORE_WARPS=1" \
    --variant "kvstore2@$N:KV_STORE_WARPS=2" --variant "default@$P:PREFETCH=True" \
    > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; cut -c1-200 "$out/ablation.jsonl"; grep -i "error\|Trace" "$out/ablation.err" | tail -5
  D=hwinfer.kernels.triton.delta_chunk
  V=(--variant "ow8@$D:OUT_LAUNCH=(8, None)" --variant "ow2@$D:OUT_LAUNCH=(2, None)"
     --variant "os1@$D:OUT_LAUNCH=(4, 1)" --variant "sw2@$D:STATE_LAUNCH=(2, 2)"
     --variant "ss1@$D:STATE_LAUNCH=(4, 1)" --variant "sw8@$D:STATE_LAUNCH=(8, 2)")
  timeout 150 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384 --no-torch \
    --no-fla --no-variants --breakdown --variant "dot@$D:GDN_SPAN='dot'" \
    --variant "diff@$D:GDN_SPAN='diff'" "${V[@]}" > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer" "$out/bench_delta_chunk.err" | cut -c1-150 | tail -75
  timeout 120 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch \
    --no-fla --no-variants --breakdown "${V[@]}" > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn\|^# hwinfer" "$out/bench_delta_chunk_kda.err" | cut -c1-150 | tail -75
elif [ "$phase" = s11c ]; then
  # (PREFETCH was removed after this run.)
  # Eleventh session, third call: the chunked output stage's raw q k^T (strict chunked suite, GDN
  # stage times against fla); Qwen3.5 card tests with the new defaults (two-warp recurrence,
  # paged prefetch); paged prefetch and split warps as paired A/B rounds; b=32 step.
  P=hwinfer.kernels.triton.paged_attention; N=hwinfer.kernels.triton.norm_rope
  D=hwinfer.kernels.triton.delta_chunk
  strict 90 "gdn_chunked or kda_chunked"
  qwen_tests 150
  timeout 210 python3 scripts/bench_ablation.py --batch 1 --prompt 1024 --new 32 --groups none \
    --repeat 3 --variant "noprefetch@$P:PREFETCH=False" --variant "split8@$P:SPLIT_WARPS=8" \
    --variant "noprefetch_split8@$P:PREFETCH=False;$P:SPLIT_WARPS=8" \
    --variant "kvstore2@$N:KV_STORE_WARPS=2" > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; grep -v '"round"' "$out/ablation.jsonl" | cut -c1-220
  grep -i "error\|Trace" "$out/ablation.err" | tail -5
  timeout 60 python3 scripts/bench_ablation.py --batch 32 --prompt 1024 --new 32 --groups none \
    > "$out/ablation_b32.jsonl" 2>&1
  echo "== b32 rc=$?"; grep "^{" "$out/ablation_b32.jsonl"
  timeout 120 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown --variant "noraw@$D:RAW_QK=False" \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous" \
    "$out/bench_delta_chunk.err" | cut -c1-150 | tail -40
elif [ "$phase" = s11d ]; then
  # Eleventh session, last call: paged attention back to its loads after the PDL wait; strict
  # paged suite; the final step figures at b=1 / 32 by group, with 8 split warps in paired rounds.
  P=hwinfer.kernels.triton.paged_attention
  strict 60 "paged"
  timeout 200 python3 scripts/bench_ablation.py --batch 1,32 --prompt 1024 --new 32 --groups non_gemv \
    --repeat 2 --variant "split8@$P:SPLIT_WARPS=8" > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; cut -c1-220 "$out/ablation.jsonl"; grep -i "error\|Trace" "$out/ablation.err" | tail -5
elif [ "$phase" = s11e ]; then
  # Eleventh session: the strict paged suite with 8 split warps from head dim 256.
  strict 90 "paged"
elif [ "$phase" = s12a ]; then
  # Prepared in the eleventh session, not yet run: the glue removed from DeepSeek-V4 / Gemma 4 /
  # Kimi-Linear on the card (strict suites of the ops now called differently: gated_act's limit,
  # the compressor step on bf16 projections; model and graph tests), then the steps timed.
  strict 150 "gated_act or kv_compress_step or lightning_indexer or sparse_mla_decode or gdn_chunked or kda_chunked"
  HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/models tests/engine/test_graphs.py -q \
    -p no:cacheprovider -k "deepseek or gemma or kimi" -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  timeout 180 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_dsv4.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4.txt" | cut -c1-300 | tail -4
elif [ "$phase" = s12b ]; then
  # Kimi-Linear 4 layers with its glue removed, then KDA vs fla (fla's first call autotunes).
  timeout 150 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | cut -c1-300 | tail -4
  timeout 330 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch \
    --no-variants > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_kda.err" | tail -6
elif [ "$phase" = s12c ]; then
  # Nsight Compute on the kernels furthest from their targets (first use of ncu here): chunked
  # KDA 1 x 4k and GDN 1 x 16k (ours and fla's), sparse MLA decode at B = 128 (bf16, FP8 cache),
  # the decode GEMV at Qwen3.5's shapes. scripts/ncu_targets.py runs each once in the range.
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "== ncu: $ncu"
  timeout 420 "$ncu" --profile-from-start off --clock-control none --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --csv --page details \
    python3 scripts/ncu_targets.py kda:1x4096 gdn:1x16384 mla:hca128 mla:hca128fp8 \
    gemv:248320x1024 gemv:8224x1024 gemv:1024x3584 > "$out/ncu.csv" 2> "$out/ncu.err"
  echo "== ncu rc=$?"; grep -v "Warn\|warn" "$out/ncu.err" | tail -5
  python3 - "$out/ncu.csv" <<'PY'
import csv, sys
keep = ("Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput",
        "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy", "Block Limit Registers",
        "Block Limit Shared Mem", "Issue Slots Busy", "Grid Size", "Warp Cycles Per Issued Instruction")
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
last = None
for r in rows:
    name = r["Kernel Name"][:40]
    if (r["ID"], name) != last:
        print(f"-- {r['ID']} {name}")
        last = (r["ID"], name)
    if r["Metric Name"] in keep:
        print(f"   {r['Metric Name']}: {r['Metric Value']} {r['Metric Unit']}")
PY
elif [ "$phase" = s12d ]; then
  # The WY stage split in two (X to memory, w / u as [64, 64] products: WY_SPLIT) and KDA's
  # diagonal blocks by levels (DIAG_FORM): strict chunked suites, then stage times against the
  # previous forms and fla (GDN; KDA's fla figure is s12b's); Kimi-Linear's step with its
  # residual adds fused into the norms.
  D=hwinfer.kernels.triton.delta_chunk
  strict 90 "gdn_chunked or kda_chunked"
  V=(--variant "one@$D:WY_SPLIT=False" --variant "wy2@$D:SPLIT_LAUNCH=(2, 4, 64)"
     --variant "wu8@$D:SPLIT_LAUNCH=(4, 8, 64)" --variant "wu32@$D:SPLIT_LAUNCH=(4, 4, 32)")
  timeout 140 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown "${V[@]}" > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_gdn.err" | cut -c1-150 | tail -20
  timeout 130 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown "${V[@]}" --variant "loop@$D:DIAG_FORM='loop'" \
    --variant "diag4@$D:DIAG_WARPS=4" --variant "before@$D:DIAG_FORM='loop';$D:WY_SPLIT=False" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_kda.err" | cut -c1-150 | tail -20
  timeout 100 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | cut -c1-300 | tail -4
elif [ "$phase" = s12e ]; then
  # The split WY stage's chosen launches (SPLIT_LAUNCH per kind) against the one-kernel form, at
  # 1 x 16k and 8 x 2k (packed, cu_seqlens): times and errors against the recurrent kernel.
  D=hwinfer.kernels.triton.delta_chunk
  timeout 110 python3 scripts/bench_delta_chunk.py --shapes 1x16384,8x2048 --no-torch --no-fla \
    --no-variants --breakdown --variant "one@$D:WY_SPLIT=False" \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous" \
    "$out/bench_delta_chunk.err" | grep -v "Memcpy" | cut -c1-150 | tail -40
elif [ "$phase" = s13a ]; then
  # Prepared in the twelfth session, not yet run: what that session wrote after its device time
  # on the card (the split WY stage's final launches, KDA's levels diagonal with 3xTF32 segment
  # sums, kda_gated_recurrent and Kimi's decode with it, the rms_norm_rope tolerance).
  strict 240 "gdn_chunked or kda_chunked or kda_gated_recurrent or kda_recurrent or rms_norm_rope"
  HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/models tests/engine/test_graphs.py -q \
    -p no:cacheprovider -k "kimi" -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  timeout 120 python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32 \
    --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_kimi.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_kimi.txt" | cut -c1-300 | tail -4
elif [ "$phase" = s13b ]; then
  # The chunked stages with the final defaults against the one-kernel WY stage and the levels
  # diagonal (3xTF32 sums), GDN with fla, KDA without (its first call autotunes for minutes).
  D=hwinfer.kernels.triton.delta_chunk
  timeout 230 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown --variant "one@$D:WY_SPLIT=False" \
    > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_gdn.err" | cut -c1-150 | tail -12
  timeout 200 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384,8x2048 --no-torch \
    --no-fla --no-variants --breakdown --variant "one@$D:WY_SPLIT=False" \
    --variant "levels@$D:DIAG_FORM='levels'" --variant "levels4@$D:DIAG_FORM='levels';$D:DIAG_WARPS=4" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_kda.err" | cut -c1-150 | tail -12
elif [ "$phase" = s13 ]; then
  # The twelfth session's untimed work (split WY launches, kda_gated_recurrent, rms_norm_rope's
  # tolerance) and the state stage with split bf16 products and the next chunk's loads in
  # flight (STATE_DOTS='split', STATE_PREFETCH): strict suites, then the stages against the
  # previous state form and fla (GDN; KDA without fla: its first call autotunes for minutes).
  D=hwinfer.kernels.triton.delta_chunk
  strict 180 "test_impl_matches_reference and triton and (gdn_chunked or kda_chunked or kda_gated_recurrent or kda_recurrent or rms_norm_rope)"
  V=(--variant "old@$D:STATE_DOTS=None;$D:STATE_PREFETCH=False" --variant "nopf@$D:STATE_PREFETCH=False"
     --variant "w8@$D:STATE_LAUNCH=(8, 2)" --variant "bv32w8@block_v=32;$D:STATE_LAUNCH=(8, 2)"
     --variant "s3@$D:STATE_LAUNCH=(4, 3)" --variant "bvo32@block_v_out=32"
     --variant "bvo128@block_v_out=128" --variant "qs0@$D:OUT_QS=''")
  timeout 150 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown "${V[@]}" > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_gdn.err" | cut -c1-150 | tail -24
  timeout 150 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384,8x2048 --no-torch \
    --no-fla --no-variants --breakdown "${V[@]}" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|^#   " \
    "$out/bench_delta_chunk_kda.err" | cut -c1-150 | tail -24
elif [ "$phase" = s13c ]; then
  # The models the twelfth session changed on the CPU only: Kimi-Linear's decode through
  # kda_gated_recurrent with its residual adds in the norms, DeepSeek-V4 / GLM-5 / HY4 with the
  # indexer's store rows from ForwardBatch.pick_rows; card tests and graphs, then the steps.
  # First the chunked stages with s13's choices as defaults (per-kernel times).
  timeout 100 python3 scripts/bench_delta_chunk.py --shapes 1x16384,8x2048 --no-torch --no-fla \
    --no-variants --breakdown > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|Memcpy" \
    "$out/bench_delta_chunk.err" | cut -c1-150 | tail -30
  HWINFER_TEST_DEVICE=cuda timeout 230 python3 -m pytest tests/models tests/engine/test_graphs.py -q \
    -p no:cacheprovider -k "kimi or deepseek or glm or hy or qwen" -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  for preset in kimi-linear-48b-a3b deepseek-v4-flash; do
    timeout 100 python3 scripts/bench_model.py --preset $preset --layers 4 --batch 1,32 \
      --prompt 1024 --new 32 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_$preset.txt" 2>&1
    grep "^{\|Error" "$out/bench_model_$preset.txt" | cut -c1-300 | tail -4
  done
elif [ "$phase" = s13d ]; then
  # The chunk table built on the device (no host read of cu_seqlens): strict chunked suites,
  # the calls against fla (8 x 2k is the varlen one), then prefill in Qwen3.5 and Kimi-Linear.
  strict 120 "test_impl_matches_reference and triton and (gdn_chunked or kda_chunked)"
  timeout 130 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch \
    --no-variants --breakdown > "$out/bench_delta_chunk_gdn.csv" 2> "$out/bench_delta_chunk_gdn.err"
  echo "== bench_delta_chunk gdn rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|Memcpy\|^#   _" \
    "$out/bench_delta_chunk_gdn.err" | cut -c1-150 | tail -24
  timeout 70 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384,8x2048 --no-torch \
    --no-fla --no-variants > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep "^kda" "$out/bench_delta_chunk_kda.err" | cut -c1-150
  for preset in "qwen3.5-0.8b" "kimi-linear-48b-a3b --layers 4"; do
    name=${preset%% *}
    timeout 90 python3 scripts/bench_model.py --preset $preset --batch 1,32 --prompt 1024 \
      --new 16 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_$name.txt" 2>&1
    grep "^{\|Error" "$out/bench_model_$name.txt" | cut -c1-300 | tail -4
  done
elif [ "$phase" = s13e ]; then
  # Why a b=1 prefill of 1,024 tokens takes 40-57 ms where 32 of them take 175 ms: host syncs
  # in the prefill forwards (find_syncs --prefill, new), then one profiled Qwen3.5 prefill.
  timeout 100 python3 scripts/find_syncs.py qwen3_5 kimi_linear deepseek_v4 --prefill \
    > "$out/syncs_prefill.txt" 2>&1
  echo "== find_syncs rc=$?"; grep -v "Warn\|warn" "$out/syncs_prefill.txt" | cut -c1-240 | head -40
  timeout 110 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1 --prompt 1024 --new 8 \
    --profile --profile-prompt 1024 --no-eager --no-hf > "$out/bench_model_qwen_profile.txt" 2>&1
  grep "^{\|Error\|# profile\|prefill" "$out/bench_model_qwen_profile.txt" | cut -c1-200 | head -40
elif [ "$phase" = s14a ]; then
  # Prepared in the fourteenth session (no machine was lent): the prefill forwards with the host
  # lists copied asynchronously and no masks / unsized repeat_interleave / device cu_seqlens
  # read (ForwardBatch.host_to_device, packed_spans, tail_tokens, cu_seqlens_host). Expect 0
  # prefill sync sites; then the card tests of the models it touched (graphs included), the
  # prefill figures (b=1 was 15,525-17,932 tok/s for Qwen3.5) and where a b=1 prefill step's
  # host time goes (cProfile of one step, bench_model --profile).
  prefill_syncs; prefill_tests; qwen_prefill_profile; model_figures
elif [ "$phase" = s14b ]; then
  # The fourteenth session's opt-in GDN WY forms, untimed: the four diagonal blocks solved
  # together (GDN_SOLVE="x4") and k k^T from the raw keys (GDN_RAW_K, decayed keys written by
  # _wu_kernel), alone and together, per kernel against the default, fla beside them (each
  # variant's outputs are checked against the recurrent kernel there); then the strict chunked
  # conformance with the new forms on (set in the process that runs pytest).
  gdn_forms; kda_forms; strict_forms
elif [ "$phase" = s15a ]; then
  # s14a and s14b regrouped for a session whose machine may come once: what checks the
  # landed code first (each part is one function above; as run in s15a the GDN function also
  # timed the fused output stage and the new forms as variants, since removed / made defaults).
  prefill_tests; gdn_forms; strict_forms
elif [ "$phase" = s15b ]; then
  kda_forms; prefill_syncs; qwen_prefill_profile; model_figures
elif [ "$phase" = s15c ]; then
  # After s15a / s15b: where the prefill's pageable host-to-device copies come from
  # (find_syncs' HostCopies, new; a Qwen3.5 1 x 1,024 step made 37 with 0 syncs reported), then
  # Qwen3.5 with GDN's new WY defaults (x4 solve, raw keys) and q / k / v taken as token-strided
  # views (no copies; written after the device time): strict chunked conformance and the Qwen3.5
  # card tests first.
  strict 60 "test_impl_matches_reference and triton and (gdn_chunked or kda_chunked)"
  qwen_tests 120
  timeout 90 python3 scripts/find_syncs.py qwen3_5 kimi_linear --prefill > "$out/copies_prefill.txt" 2>&1
  echo "== find_syncs --prefill rc=$?"; grep -v "Warn\|warn" "$out/copies_prefill.txt" | cut -c1-260 | head -30
  timeout 130 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 16 \
    --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_qwen.txt" | cut -c1-330 | tail -3
elif [ "$phase" = s17a ]; then
  # s16a without its strict suites (the lane runs them all): card tests of the models the
  # sixteenth and seventeenth sessions touched (Triton varlen attention now runs every dense
  # prefill on the card), prefill syncs, K3's decode syncs.
  HWINFER_TEST_DEVICE=cuda timeout 330 python3 -m pytest tests/engine/test_prefill_graphs.py tests/models \
    tests/engine/test_graphs.py tests/engine/test_batch.py -q -p no:cacheprovider \
    -k "prefill_graphs or qwen or kimi or minimax or deepseek or glm or hy or gemma or overlap or batch" \
    -rf --tb=short > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -10
  timeout 120 python3 scripts/find_syncs.py qwen3_5 kimi_linear kimi_k3 minimax_m3 deepseek_v4 --prefill \
    > "$out/syncs_prefill.txt" 2>&1
  echo "== find_syncs --prefill rc=$?"; grep -v "Warn\|warn" "$out/syncs_prefill.txt" | cut -c1-260 | head -30
  timeout 60 python3 scripts/find_syncs.py kimi_k3 > "$out/syncs_decode_k3.txt" 2>&1
  echo "== find_syncs kimi_k3 (decode) rc=$?"; grep -v "Warn\|warn" "$out/syncs_decode_k3.txt" | cut -c1-260 | head -12
elif [ "$phase" = s18a ]; then
  # (Ran at 37654c6; the prefetch code it toggles was removed after, so it fails on later trees.)
  # The L2 prefetch of the next product's weights from the decode GEMVs (new, off by default):
  # Qwen3.5-0.8B b=1 decode steps with it (distance 1 / 2, per-line / bulk, the GEMVs' own loads
  # marked evict-first or not) against the default, two paired rounds; then the Qwen3.5,
  # graph and prefill-graph tests on the card with it on (tokens equal eager).
  L=hwinfer.kernels.triton.l2:ENABLED=True
  timeout 330 python3 scripts/bench_ablation.py --batch 1 --prompt 1024 --new 32 --groups none \
    --repeat 2 --variant "l2@$L" --variant "l2d2@$L;hwinfer.kernels.weight_order:DISTANCE=2" \
    --variant "bulk@$L;hwinfer.kernels.triton.l2:MODE='bulk'" \
    --variant "l2ev@$L;hwinfer.kernels.triton.l2:WEIGHT_EVICT='evict_first'" --regs > "$out/ablation.jsonl" 2> "$out/ablation.err"
  echo "== ablation rc=$?"; grep -v '"regs"\|gemv\|kernel' "$out/ablation.jsonl" | cut -c1-260
  grep -i "gemv" "$out/ablation.jsonl" | cut -c1-200 | head -12; grep -i "error" "$out/ablation.err" | tail -3
  HWINFER_L2_PREFETCH=1 HWINFER_TEST_DEVICE=cuda timeout 120 python3 -m pytest tests/engine/test_graphs.py \
    tests/engine/test_prefill_graphs.py -q -p no:cacheprovider -k "qwen or overlap or prefill_graphs" -rf \
    --tb=short > "$out/tests_l2.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests_l2.txt" | cut -c1-300 | tail -8
elif [ "$phase" = s19a ]; then
  # KDA's diagonal row loop fetching row t+1 during row t (DIAG_AHEAD, new, off by default),
  # at 2 and 4 warps, against the loop; the strict KDA conformance with it on; then s18c.
  timeout 200 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown --variant "ahead@$D:DIAG_AHEAD=True" \
    --variant "ahead4@$D:DIAG_AHEAD=True;$D:DIAG_WARPS=4" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|Memcpy" \
    "$out/bench_delta_chunk_kda.err" | grep "_kda_diag\|^kda" | cut -c1-150 | head -24
  ahead_strict 80
  bash "$0" s18c
elif [ "$phase" = s19b ]; then
  # The diagonal loop 0 / 1 (default) / 2 rows ahead, GDN and KDA beside fla on this card;
  # strict KDA conformance 2 ahead; Gemma 4 (text stack of the 12B preset, 6 layers) with and
  # without prefill graphs.
  timeout 240 python3 scripts/bench_delta_chunk.py --kinds gdn,kda --shapes 1x16384 --no-torch \
    --no-variants --breakdown --variant "ahead0@$D:DIAG_AHEAD=0" --variant "ahead2@$D:DIAG_AHEAD=2" \
    > "$out/bench_delta_chunk.csv" 2> "$out/bench_delta_chunk.err"
  echo "== bench_delta_chunk rc=$?"; grep -v "Warn\|warn\|^# hwinfer\|at::native\|anonymous\|Memcpy" \
    "$out/bench_delta_chunk.err" | grep "_kda_diag\|^kda\|^gdn" | cut -c1-150 | head -24
  ahead_strict 80
  gemma_graphs
elif [ "$phase" = s19c ]; then
  # Gemma 4's full layers (512-wide K != V) on the card: strict attention conformance (new case
  # gemma4_full_512, 2-stage tile), the prefill-graph tests, then the 6-layer model with and
  # without prefill graphs.
  strict 60 "test_impl_matches_reference and triton and attention"
  HWINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest tests/engine/test_prefill_graphs.py -q \
    -p no:cacheprovider -k "gemma4" -rf --tb=short > "$out/tests_gemma_graphs.txt" 2>&1
  grep -E "^FAILED|passed|failed|skipped" "$out/tests_gemma_graphs.txt" | cut -c1-300 | tail -6
  gemma_graphs
elif [ "$phase" = s20a ]; then
  # DeepSeek-V4's prefill in CUDA graphs (new: its cached prefill from device values) and
  # Kimi-K3's: the prefill-graph tests on the card; the strict attention conformance (Gemma 4's
  # 512-wide case, never judged on a card); V4-Flash 4 layers with and without prefill graphs.
  HWINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest tests/engine/test_prefill_graphs.py -q \
    -p no:cacheprovider -k "deepseek or k3 or host_lengths" -rf --tb=short > "$out/tests_v4_graphs.txt" 2>&1
  grep -E "^FAILED|passed|failed|skipped" "$out/tests_v4_graphs.txt" | cut -c1-300 | tail -6
  strict 150 "test_impl_matches_reference and triton and attention"
  timeout 200 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 1 \
    --prompt 1024 --new 16 --no-eager --no-hf --without-prefill-graphs --csv "$out/model.csv" \
    > "$out/bench_model_v4.txt" 2>&1
  echo "== v4 rc=$?"; grep "^{\|Error" "$out/bench_model_v4.txt" | cut -c1-400 | tail -3
elif [ "$phase" = s20b ]; then
  # The MoE GEMMs' K step (twentieth session: exact decodes by one multiply, FP4 scales per
  # 32-group, activations loaded once for gate and up and split into column pairs): strict
  # conformance of the expert ops; Kimi-K3's latent MoE (real size, 1,024 and 1 tokens) and the
  # DSV4-Flash-size FP4 / FP8 experts (1 and 512 tokens), each form and tile, against the tree of
  # 1137b7c (carried as .out/base/hwinfer); then K3 4 layers prefill.
  V="--variant g0@FP4_GROUPS=0 --variant p0@A_PAIRS=0"
  timeout 90 python3 scripts/bench_moe.py --latent --tokens 1024,1 $V \
    > "$out/bench_moe_latent.csv" 2> "$out/bench_moe_latent.err"
  echo "== latent rc=$?"; grep -v "Warn\|warn" "$out/bench_moe_latent.err" | cut -c1-200 | tail -24
  PYTHONPATH=.out/base${PYTHONPATH:+:$PYTHONPATH} timeout 50 python3 scripts/bench_moe.py --latent \
    --tokens 1024,1 > "$out/bench_moe_latent_base.csv" 2> "$out/bench_moe_latent_base.err"
  echo "== latent at 1137b7c rc=$?"; grep -v "Warn\|warn" "$out/bench_moe_latent_base.err" | cut -c1-200 | tail -8
  strict 70 "test_impl_matches_reference and triton and (moe_experts or latent_moe)"
  timeout 60 python3 scripts/bench_moe.py --tokens 1,512 --no-torch --formats fp4,fp8 \
    --variant n32@TILE_OVERRIDE=16x32x128x4 > "$out/bench_moe.csv" 2> "$out/bench_moe.err"
  echo "== experts rc=$?"; grep -v "Warn\|warn\|max|" "$out/bench_moe.err" | cut -c1-200 | tail -30
  PYTHONPATH=.out/base${PYTHONPATH:+:$PYTHONPATH} timeout 40 python3 scripts/bench_moe.py --tokens 1,512 \
    --no-torch > "$out/bench_moe_base.csv" 2> "$out/bench_moe_base.err"
  echo "== experts at 1137b7c rc=$?"; grep -v "Warn\|warn\|max|" "$out/bench_moe_base.err" | cut -c1-200 | tail -8
elif [ "$phase" = s20c ]; then
  # s20b's forms chosen (decode tiles 16 x 32): K3's latent MoE prefill tiles, then Kimi-K3
  # 4 layers (prefill profile) and the DSV4-size experts at 1 token.
  timeout 70 python3 scripts/bench_moe.py --latent --tokens 1024,1 \
    --variant t16@TILE_OVERRIDE=16x64x128x4 --variant t64@TILE_OVERRIDE=64x128x64x8 \
    --variant w8@TILE_OVERRIDE=32x64x128x8 > "$out/bench_moe_latent.csv" 2> "$out/bench_moe_latent.err"
  echo "== latent rc=$?"; grep -v "Warn\|warn\|max|\|^#" "$out/bench_moe_latent.err" | cut -c1-200 | tail -12
  timeout 90 python3 scripts/bench_model.py --preset kimi-k3 --layers 4 --batch 1 --prompt 1024 --new 8 \
    --no-eager --no-hf --profile --profile-prompt 1024 --csv "$out/model.csv" > "$out/bench_model_k3.txt" 2>&1
  echo "== k3 rc=$?"; grep "^{\|Error" "$out/bench_model_k3.txt" | cut -c1-300 | tail -3
  grep -A 12 "# profile prefill" "$out/bench_model_k3.txt" | cut -c1-160 | head -14
elif [ "$phase" = s20d ]; then
  # The expert FFN's decode form (moe_gemv.py, opt-in: HWINFER_MOE_DECODE=gemv), the tile
  # form's products transposed (SWAP_AB: wgmma with the weights as the left operand; offline no
  # spills where the default spills 644 B), its tiles / pipelining depth: the strict expert-op conformance with the decode form on;
  # Kimi-K3's latent MoE (1 and 1,024 tokens) and the DSV4-size FP4 / FP8 experts (1, 4, 32, 512
  # tokens) in each form; K3 and DeepSeek-V4-Flash 4 layers b=1 with and without it.
  HWINFER_MOE_DECODE=gemv strict 60 "test_impl_matches_reference and triton and (moe_experts or latent_moe)"
  G="--variant gemv@DECODE_FORM=gemv --variant gemv256@DECODE_FORM=gemv;GEMV_TILE=4x256x4"
  G="$G --variant gemv8@DECODE_FORM=gemv;GEMV_TILE=8x256x4"
  timeout 75 python3 scripts/bench_moe.py --latent --tokens 1,1024 $G --variant sw@SWAP_AB=1 \
    --variant "sw64@SWAP_AB=1;TILE_OVERRIDE=32x128x64x4" --variant "sw8@SWAP_AB=1;TILE_OVERRIDE=64x128x64x8" \
    --variant k64@TILE_OVERRIDE=32x64x64x4 --variant s4@NUM_STAGES=4 \
    > "$out/bench_moe_latent.csv" 2> "$out/bench_moe_latent.err"
  echo "== latent rc=$?"; grep -v "Warn\|warn\|max|\|^#" "$out/bench_moe_latent.err" | cut -c1-120 | tail -14
  timeout 90 python3 scripts/bench_moe.py --tokens 1,4,32,512 --no-torch $G \
    --variant "gemv_all@DECODE_FORM=gemv;GEMV_MAX_PAIRS=256" --variant sw@SWAP_AB=1 \
    --variant k64@TILE_OVERRIDE=16x64x64x4 --variant k32@TILE_OVERRIDE=16x64x32x4 \
    --variant "swk64@SWAP_AB=1;TILE_OVERRIDE=16x64x64x4" \
    > "$out/bench_moe.csv" 2> "$out/bench_moe.err"
  echo "== experts rc=$?"; grep -v "Warn\|warn\|max|\|^#\|route\|ids match" "$out/bench_moe.err" | cut -c1-120 | tail -50
  for form in tiles gemv; do
    for preset in kimi-k3 deepseek-v4-flash; do
      HWINFER_MOE_DECODE=$form timeout 100 python3 scripts/bench_model.py --preset $preset --layers 4 \
        --batch 1 --prompt 256 --new 16 --no-eager --no-hf --without-prefill-graphs \
        --csv "$out/model.csv" > "$out/bench_model_${preset}_$form.txt" 2>&1
      echo "== $preset $form rc=$?"; grep "^{\|Error" "$out/bench_model_${preset}_$form.txt" | cut -c1-300 | tail -2
    done
  done
elif [ "$phase" = s21a ]; then
  # The 21st session's MoE defaults (DECODE_FORM gemv at 8 x 256, SWAP_AB on sm_90) against the
  # old ones (old@...), and the tiles of the middle sizes (16-48 rows an expert) with the swap.
  strict 60 "test_impl_matches_reference and triton and (moe_experts or latent_moe)"
  OLD="--variant old@DECODE_FORM=tiles;SWAP_AB=0"
  timeout 150 python3 scripts/bench_moe.py --tokens 1,4,32,512,2048 --formats bf16,fp8,fp4 \
    --no-torch $OLD --variant m16@TILE_OVERRIDE=16x128x64x4 --variant m32@TILE_OVERRIDE=32x128x64x4 \
    --variant nosw@SWAP_AB=0 > "$out/bench_moe.csv" 2> "$out/bench_moe.err"
  echo "== experts rc=$?"; grep -v "Warn\|warn\|max|\|^#\|route\|ids match" "$out/bench_moe.err" | cut -c8-100 | tail -80
  timeout 80 python3 scripts/bench_moe.py --latent --tokens 1,64,1024 $OLD \
    --variant m32@TILE_OVERRIDE=32x128x64x4 --variant l64@TILE_OVERRIDE=64x128x64x4 \
    > "$out/bench_moe_latent.csv" 2> "$out/bench_moe_latent.err"
  echo "== latent rc=$?"; grep -v "Warn\|warn\|max|\|^#" "$out/bench_moe_latent.err" | cut -c8-100 | tail -20
  for preset in kimi-k3 kimi-linear-48b-a3b; do
    for form in old new; do
      env $([ $form = old ] && echo HWINFER_MOE_DECODE=tiles HWINFER_MOE_SWAP_AB=0) timeout 60 \
        python3 scripts/bench_model.py --preset $preset --layers 4 --batch 1 --prompt 1024 --new 16 \
        --no-eager --no-hf --csv "$out/model.csv" > "$out/model_${preset}_$form.txt" 2>&1
      echo "== $preset $form rc=$?"; grep "^{\|Error" "$out/model_${preset}_$form.txt" | cut -c1-230 | tail -2
    done
  done
  tar czf "$out/models.tgz" -C "$out" $(cd "$out" && ls model_*.txt) && rm -f "$out"/model_*.txt
elif [ "$phase" = s22a ]; then
  # The warp-specialised Gluon sparse MLA decode (sparse_mla_ws.py): its card test, strict
  # sparse MLA conformance with it forced on, then V4 decode shapes against the Triton kernel.
  timeout 200 python3 -m pytest tests/kernels/test_sparse_mla_ws.py -q -x -p no:cacheprovider \
    > "$out/test_ws.txt" 2>&1
  echo "== test_sparse_mla_ws rc=$?"; grep -E "passed|failed|Error|assert" "$out/test_ws.txt" | cut -c1-300 | tail -12
  HWINFER_SPARSE_MLA_WS=1 strict 120 "sparse_mla_decode"
  timeout 240 python3 scripts/bench_sparse_mla.py --only dsv4 --ws > "$out/bench_ws.csv" 2> "$out/bench_ws.err"
  echo "== bench_sparse_mla --ws rc=$?"; grep -v "Warn\|warn" "$out/bench_ws.err" | grep "sparse_mla\|rror" | cut -c1-160 | tail -40
elif [ "$phase" = s22b ]; then
  # DeepSeek-V4-Flash, 4 real-size layers: decode with the Gluon sparse MLA off / on.
  for ws in 0 1; do
    HWINFER_SPARSE_MLA_WS=$ws timeout 150 python3 scripts/bench_model.py --preset deepseek-v4-flash \
      --layers 4 --batch 1,32 --prompt ${PROMPT:-1024} --new 16 --no-eager --no-hf --kv-format bf16 \
      --csv "$out/model.csv" \
      > "$out/model_v4_ws$ws.txt" 2>&1
    echo "== V4 ws=$ws rc=$?"; grep "^{\|Error" "$out/model_v4_ws$ws.txt" | cut -c1-260 | tail -3
  done
elif [ "$phase" = s21e ]; then
  # GDN's output stage with bf16 operands (KDA's default since 21st session), and KDA's state
  # walk without prefetch / with 16-channel blocks, per kernel (1 x 16k, 8 x 2k).
  timeout 100 python3 scripts/bench_delta_chunk.py --kinds gdn --shapes 1x16384,8x2048 --no-torch --no-fla \
    --no-variants --breakdown --variant "obf16@dots='bf16'" --variant "obf16v64@dots='bf16';block_v_out=64" \
    > "$out/bench_gdn.csv" 2> "$out/bench_gdn.err"
  echo "== gdn rc=$?"; grep -v "Warn\|warn" "$out/bench_gdn.err" | grep "^gdn\|_out_kernel" | cut -c1-150 | head -20
  timeout 60 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown --variant "pf0@$D:STATE_PREFETCH=False" --variant "bv16@block_v=16" \
    > "$out/bench_kda.csv" 2> "$out/bench_kda.err"
  echo "== kda rc=$?"; grep -v "Warn\|warn" "$out/bench_kda.err" | grep "^kda\|_state_kernel" | cut -c1-150 | head -20
elif [ "$phase" = s21b ]; then
  # Ran at 26c179d (KDA's output stage inside the state kernel, FUSED_OUT): 1.2x slower, the code
  # removed after; check out that tree to run it again (docs/runs/2026-12-05-h100-s21/s21ab/).
  echo "s21b needs the 26c179d tree (FUSED_OUT was removed)"; exit 2
elif [ "$phase" = s20e ]; then
  # KDA's WY kernel in 16-channel blocks (offline, ptxas of Triton 3.7.1 for sm_90: 164 B
  # spilled at 4 warps and 12 at 8, against 756 for the default 32 channels at 4 warps; 8 warps
  # at 32 channels was slower on the H200, 1,880 against 1,164 us): per kernel at 1 x 16k.
  timeout 200 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch --no-fla \
    --no-variants --breakdown --variant "bk16@block_k=16" \
    --variant "bk16w8@block_k=16;$D:SPLIT_LAUNCH={'gdn': (2, 4, 32), 'kda': (8, 4, 32)}" \
    > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_kda.err" \
    | grep "_wy\|_kda_diag\|^kda\|regs" | cut -c1-160 | head -30
elif [ "$phase" = s18c ]; then
  # Kimi-K3's slow prefill (2,814 tok/s b=1 in s17): the kernels of one 1 x 1,024 step.
  timeout 200 python3 scripts/bench_model.py --preset kimi-k3 --layers 4 --batch 1 --prompt 1024 --new 8 \
    --no-eager --no-hf --profile --profile-prompt 1024 --csv "$out/model.csv" > "$out/bench_model_k3.txt" 2>&1
  echo "== k3 rc=$?"; grep "^{\|Error" "$out/bench_model_k3.txt" | cut -c1-300 | tail -3
  grep -A 28 "# profile prefill" "$out/bench_model_k3.txt" | cut -c1-160 | head -30
  gemma_graphs
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
elif [ "$phase" = s17lane ]; then
  # The sm_90 lane (every op's strict conformance on the card, then the op benchmarks, quick
  # shapes, 300 s of them), its CSV and logs under $OUT.
  HWINFER_COMMIT=${HWINFER_COMMIT:-$(cat "$out/commit.txt" 2>/dev/null || echo unknown)} \
    LANE_BUDGET_S=330 LANE_QUICK=1 BENCH_TIMEOUT_S=100 HWINFER_RESULTS_DIR="$out/results" \
    HWINFER_LOG_DIR="$out/lane" timeout 580 bash ci/lane.sh nvidia-sm90 > "$out/lane.txt" 2>&1
  echo "== lane rc=$?"; grep -E "^==|^!!|passed|failed" "$out/lane.txt" | cut -c1-200 | tail -40
elif [ "$phase" = s17b ]; then
  # Strict conformance of the ops written since the last card run (Triton varlen attention, the
  # sixteenth session's prefill ops), the attention kernel against one SDPA call per sequence,
  # Qwen3.5-0.8B with prefill graphs at b=1 (new) and b=32.
  strict 120 "test_impl_matches_reference and triton and (attention or gdn_chunked or kda_chunked or causal_conv1d or latent_moe or moe_experts or block_sparse or kda_gate or paged_rows)"
  timeout 150 python3 scripts/bench_attention.py --sweep > "$out/bench_attention.csv" 2> "$out/bench_attention.err"
  echo "== bench_attention rc=$?"; grep -v "Warn\|warn" "$out/bench_attention.err" | tail -70
  timeout 150 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 16 \
    --no-eager --no-hf --without-prefill-graphs --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_qwen.txt" | cut -c1-400 | tail -4
elif [ "$phase" = s17c ]; then
  # Kimi-K3 and Kimi-Linear 4 real-size layers (K3's latent MoE through the Triton impl).
  for preset in kimi-k3 kimi-linear-48b-a3b; do
    timeout 200 python3 scripts/bench_model.py --preset $preset --layers 4 --batch 1,32 --prompt 1024 \
      --new 16 --no-eager --no-hf --without-prefill-graphs --csv "$out/model.csv" > "$out/bench_model_$preset.txt" 2>&1
    echo "== $preset rc=$?"; grep "^{\|Error" "$out/bench_model_$preset.txt" | cut -c1-400 | tail -4
  done
elif [ "$phase" = s16a ]; then
  # Everything written since the fifteenth session's device time, none of it on a card yet:
  # q / k / v as token-strided views, the conv and the chunked delta rule on the cache's state
  # rows in place in prefill (state_slots), Triton latent_moe (Kimi-K3, no host sync), Triton
  # block-sparse prefill (MiniMax-M3's indexer and attention, no host sync), Triton kda_gate,
  # the paged_rows op (decode of V4 / GLM-5 / HY4 / M3 under graphs), the engine's host-built
  # step inputs (ForwardBatch.from_host). Strict conformance of those ops, the card tests of
  # every model they touch, syncs in prefill (and K3's decode).
  strict 90 "test_impl_matches_reference and triton and (gdn_chunked or kda_chunked or causal_conv1d or latent_moe or moe_experts or block_sparse or kda_gate or paged_rows)"
  HWINFER_TEST_DEVICE=cuda timeout 270 python3 -m pytest tests/models tests/engine/test_graphs.py \
    tests/engine/test_batch.py -q -p no:cacheprovider \
    -k "qwen or kimi or minimax or deepseek or glm or hy or overlap or batch" -rf --tb=short \
    > "$out/tests.txt" 2>&1
  grep -E "^FAILED|passed|failed" "$out/tests.txt" | cut -c1-300 | tail -8
  timeout 100 python3 scripts/find_syncs.py qwen3_5 kimi_linear kimi_k3 minimax_m3 --prefill > "$out/syncs_prefill.txt" 2>&1
  echo "== find_syncs --prefill rc=$?"; grep -v "Warn\|warn" "$out/syncs_prefill.txt" | cut -c1-260 | head -30
  timeout 60 python3 scripts/find_syncs.py kimi_k3 > "$out/syncs_decode_k3.txt" 2>&1
  echo "== find_syncs kimi_k3 (decode) rc=$?"; grep -v "Warn\|warn" "$out/syncs_decode_k3.txt" | cut -c1-260 | head -12
elif [ "$phase" = s16b ]; then
  # s16a's model steps: Qwen3.5-0.8B whole (b=1 prefill is host-bound: the launches and host
  # costs removed this session), Kimi-Linear and Kimi-K3 4 real-size layers (K3's latent MoE
  # through the new Triton impl, its FP4 experts packed as published).
  timeout 130 python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32 --prompt 1024 --new 16 \
    --no-eager --no-hf --profile --profile-prompt 1024 --csv "$out/model.csv" > "$out/bench_model_qwen.txt" 2>&1
  grep "^{\|Error\|# profile" "$out/bench_model_qwen.txt" | cut -c1-330 | tail -6
  for preset in kimi-linear-48b-a3b kimi-k3; do
    timeout 200 python3 scripts/bench_model.py --preset $preset --layers 4 --batch 1,32 \
      --prompt 1024 --new 16 --no-eager --no-hf --csv "$out/model.csv" > "$out/bench_model_$preset.txt" 2>&1
    echo "== $preset rc=$?"; grep "^{\|Error" "$out/bench_model_$preset.txt" | cut -c1-330 | tail -3
  done
elif [ "$phase" = s15d ]; then
  # s15c's first part alone (for a call with little device time left).
  timeout 80 python3 scripts/find_syncs.py qwen3_5 --prefill > "$out/copies_prefill.txt" 2>&1
  echo "== find_syncs --prefill rc=$?"; grep -v "Warn\|warn" "$out/copies_prefill.txt" | cut -c1-260 | head -30
elif [ "$phase" = next10c ]; then
  # KDA vs fla with time for fla's first compiles (autotuning); DeepSeek-V4 b=32 against
  # transformers with our model not resident.
  timeout 330 python3 scripts/bench_delta_chunk.py --kinds kda --shapes 1x16384 --no-torch \
    --no-variants > "$out/bench_delta_chunk_kda.csv" 2> "$out/bench_delta_chunk_kda.err"
  echo "== bench_delta_chunk kda rc=$?"; grep -v "Warn\|warn" "$out/bench_delta_chunk_kda.err" | tail -6
  cat "$out/bench_delta_chunk_kda.csv"
  timeout 200 python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 32 \
    --prompt 1024 --new 16 --no-eager --hf-only > "$out/bench_model_dsv4_hf32.txt" 2>&1
  grep "^{\|Error" "$out/bench_model_dsv4_hf32.txt" | cut -c1-400 | tail -3
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
