"""Expert parallelism over 2 CPU processes (gloo): the Dispatch primitive against a
single-process sum, and Qwen3.5-MoE / Kimi-Linear / Kimi-K3 sharded with expert_parallel False
(experts split by intermediate channels) and True (experts partitioned, all-to-all) giving the
logits and greedy tokens of one process."""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.parallel import Dispatch, expert_parallel_moe, run_parallel, shard_model, token_slice
from hwinfer.testing.checkpoints import write_checkpoint
from hwinfer.testing.tiny import qwen3_5_moe as tiny_qwen3_5_moe

WORLD = 2
PROMPTS = [[5, 17, 99, 3, 250], [7, 1, 300, 42, 42, 8, 19, 101, 64, 2, 77, 31, 12]]
# Logits tolerance (max abs diff / max abs ref). Not 1e-5: these tiny random checkpoints amplify
# fp32 rounding ~100x in their GDN / KDA layers (the gated RMSNorm of small per-head outputs), so
# any change of summation order moves the logits by 0.3-2.5e-5 depending on the input ids: the
# dense TP path (tensor.py) gives 0.4-1.5e-5 over six seeds, these models 0.3-2.5e-5 in both
# modes, and the single-process fp32 run itself moves by 1e-5-1.6e-4 when only its parameters
# are held in fp64. A sharding mistake shows as O(1) differences and different tokens.
REL_TOL = 5e-5


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 37), generator=torch.Generator().manual_seed(0))


# --- Dispatch -----------------------------------------------------------------------------------

def _routed_reference(x, weights, ids, w):
    """Single-process routed sum: y_t = sum_j weights[t, j] * x_t W_{ids[t, j]} (fp32, in order)."""
    out = torch.zeros_like(x)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            if ids[t, j] >= 0:
                out[t] += weights[t, j] * (x[t] @ w[ids[t, j]])
    return out


def _routing(t: int, experts: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(t, 8, generator=g), torch.randn(experts, 8, 8, generator=g)
    # Only the first half of the experts is ever chosen: rank 1's experts get no rows at all.
    ids = torch.randint(0, experts // 2, (t, k), generator=g)
    if t:
        ids[0, 1] = -1  # a skipped choice
    return x, torch.rand(t, k, generator=g), ids, w


def _dispatch_worker(ctx):
    experts, k, results = 8, 3, {}
    local = experts // ctx.world_size
    for t in (0, 1, 5, 16):  # 0 and 1 < W: some rank has no tokens
        x, weights, ids, w = _routing(t, experts, k, seed=t)
        mine = w[ctx.rank * local:(ctx.rank + 1) * local]
        received = []

        def run(rows, local_ids):
            received.append(local_ids.tolist())
            return torch.einsum("md,mde->me", rows, mine[local_ids])
        out = expert_parallel_moe(x, weights, ids, experts, run)
        results[t] = (out, received, token_slice(t))
    # plan_many: several plans, one count exchange; used through expert_parallel_moe(plan=...).
    cases = [_routing(9, experts, k, seed=s) for s in (1, 2)]
    rows = token_slice(9)
    plans = Dispatch.plan_many([ids[rows] for _, _, ids, _ in cases], experts)
    many = [expert_parallel_moe(x, weights, ids, experts, lambda r, i, w=w: torch.einsum(
                "md,mde->me", r, w[ctx.rank * local:(ctx.rank + 1) * local][i]), plan=plan)
            for (x, weights, ids, w), plan in zip(cases, plans)]
    refusals = []
    for ids, experts_ in ((torch.zeros(2, 1, dtype=torch.long), 7), (torch.full((2, 1), 8), 8)):
        try:
            Dispatch.plan(ids, experts_)
            refusals.append("not refused")
        except ValueError as exc:
            refusals.append(str(exc))
    return results, many, refusals


def _same_sum(out: torch.Tensor, ref: torch.Tensor) -> None:
    # Not bit-exact: the worker's batched einsum and the reference's per-row products may take
    # different CPU matmul paths (their choice can depend on the threads free at the time: CI
    # saw a 1-ulp difference once with the machine busy), so the 8-term dots may round apart.
    # A routing mistake moves rows by O(1).
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_dispatch_matches_single_process():
    results, many, refusals = run_parallel(_dispatch_worker, WORLD, timeout=60)
    for t, (out, received, rows) in results.items():
        x, weights, ids, w = _routing(t, 8, 3, seed=t)
        _same_sum(out, _routed_reference(x, weights, ids, w))
        assert rows == slice(0, min(t, -(-t // 2)))
        # rank 0 owns experts 0-3 (every choice lands there); its received ids are local ids.
        assert all(0 <= i < 4 for ids_ in received for i in ids_)
    for (x, weights, ids, w), out in zip([_routing(9, 8, 3, seed=s) for s in (1, 2)], many):
        _same_sum(out, _routed_reference(x, weights, ids, w))
    assert "number of experts divisible by 2, got 7" in refusals[0]
    assert "expert ids must lie in [0, 8)" in refusals[1]


# --- models -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ep")
    five = write_checkpoint("qwen3_5_moe", root / "five", overrides={"text_config": {
        **tiny_qwen3_5_moe.config("tiny")["text_config"], "num_experts": 5}})
    return {arch: write_checkpoint(arch, root / arch) for arch in ("qwen3_5_moe", "kimi_linear", "kimi_k3")}, five


def _speculative_tokens(model) -> list[list[int]]:
    """Greedy through the engine with the (sharded) MTP head drafting 2 tokens a step."""
    engine = Engine(model, max_num_seqs=2, num_blocks=16, num_speculative_tokens=2)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=12, temperature=0)) for p in PROMPTS]
    return [o.token_ids for o in engine.run(reqs)]


def _model_worker(ctx, path, odd):
    """Both modes on one spawn: load, shard, logits, greedy generate."""
    out = {}
    for ep in (False, True):
        model = shard_model(load_model(path, device=ctx.device, dtype="float32"), expert_parallel=ep)
        out[ep] = {"logits": model(_ids(model.config["vocab_size"])),
                   "tokens": [o.token_ids for o in model.generate(PROMPTS, max_new_tokens=12, temperature=0)],
                   "graph_decode": model.graph_decode}
        # One sequence: decode steps of 1 token, so one rank has no tokens to dispatch.
        out[ep]["single"] = model.generate([PROMPTS[1]], max_new_tokens=12, temperature=0)[0].token_ids
        if getattr(model, "mtp", None) is not None:
            out[ep]["spec_tokens"] = _speculative_tokens(model)
        block = next(m for m in model.modules() if hasattr(m, "parallel"))
        out[ep]["experts"] = tuple(block.experts.w13.shape)
    if odd is not None:
        model = load_model(odd, device=ctx.device, dtype="float32")
        w13 = model.layers[0].mlp.experts.w13.shape
        try:
            shard_model(model, expert_parallel=True)
            out["refusal"] = "not refused"
        except ValueError as exc:
            out["refusal"] = str(exc)
        out["untouched"] = model.layers[0].mlp.experts.w13.shape == w13 and not getattr(model, "tensor_parallel", None)
    return out


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "kimi_linear", "kimi_k3"])
def test_tp2_and_ep2_match_single_process(ckpts, arch):
    paths, five = ckpts
    ref = load_model(paths[arch], device="cpu", dtype="float32")
    ref_logits = ref(_ids(ref.config["vocab_size"]))
    ref_tokens = [o.token_ids for o in ref.generate(PROMPTS, max_new_tokens=12, temperature=0)]
    ex = next(m.experts for m in ref.modules() if hasattr(m, "experts"))

    got = run_parallel(_model_worker, WORLD, (str(paths[arch]), str(five) if arch == "qwen3_5_moe" else None),
                       timeout=120)

    for ep in (False, True):
        rel = (got[ep]["logits"] - ref_logits).abs().max() / ref_logits.abs().max()
        assert rel <= REL_TOL, (ep, rel)
        assert got[ep]["tokens"] == ref_tokens, ep
        assert got[ep].get("spec_tokens", ref_tokens) == ref_tokens, ep
        assert got[ep]["single"] == ref_tokens[1], ep
    assert got[False]["experts"] == (ex.num, ex.inter, ex.hidden)  # 2I/2 rows: half of each expert
    assert got[True]["experts"] == (ex.num // 2, 2 * ex.inter, ex.hidden)  # half of the experts
    assert got[True]["graph_decode"] is False and got[False]["graph_decode"] == ref.graph_decode
    if arch == "qwen3_5_moe":
        assert "spec_tokens" in got[True]  # the MTP layer's MoE is sharded too
        assert "number of experts divisible by 2, got 5" in got["refusal"]
        assert got["untouched"]
