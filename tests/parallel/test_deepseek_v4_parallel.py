"""DeepSeek-V4 over 2 CPU processes (gloo), tensor parallel with the MoE split by intermediate
channels or by experts (all-to-all): same logits, greedy and MTP-speculative tokens as one
process; the indexer's picks, logits and tokens identical on both ranks; the hash layers'
dispatch planned once per forward; refusals before anything changes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.layers.deepseek_v4_attention import Indexer
from hwinfer.parallel import expert, run_parallel, shard_model
from hwinfer.parallel.deepseek_v4 import shard_deepseek_v4
from hwinfer.testing.checkpoints import write_checkpoint
from hwinfer.testing.tiny import deepseek_v4 as tiny

WORLD = 2
# 9 and 22 tokens (+12 generated): past the sliding window (8), several CSA (4) and HCA (8)
# windows, in prefill and in decode.
PROMPTS = [[5, 17, 99, 3, 250, 8, 9, 10, 11],
           [7, 1, 300, 42, 42, 8, 19, 101, 64, 2, 77, 31, 12, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsv4_tp")
    main = write_checkpoint("deepseek_v4", root / "main")
    groups = write_checkpoint("deepseek_v4", root / "groups", overrides={**tiny.config("tiny"), "o_groups": 1})
    moe = write_checkpoint("deepseek_v4", root / "moe", overrides={
        **tiny.config("tiny"), "n_routed_experts": 3, "moe_intermediate_size": 33})
    return str(main), str(groups), str(moe)


def _ids() -> torch.Tensor:
    return torch.randint(0, tiny.config("tiny")["vocab_size"], (2, 37), generator=torch.Generator().manual_seed(0))


def _refusal(fn, model=None) -> str:
    """fn's ValueError message; with ``model``: also that the model was left unsharded."""
    try:
        fn()
    except ValueError as exc:
        if model is not None:
            attn = model.layers[0].attn
            assert attn.heads == model.config["num_attention_heads"] and attn.wq_b.weight.shape[0] == \
                attn.heads * attn.head_dim and not getattr(model, "tensor_parallel", None)
        return str(exc)
    return "not refused"


def _speculative(model) -> list[list[int]]:
    """Greedy through the engine, the (sharded) MTP block drafting 2 tokens a step."""
    engine = Engine(model, max_num_seqs=2, num_blocks=16, num_speculative_tokens=2)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=12, temperature=0)) for p in PROMPTS]
    return [o.token_ids for o in engine.run(reqs)]


def _same_on_every_rank(value) -> bool:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return all(g == gathered[0] for g in gathered)


def _worker(ctx, main, groups, moe, ep):
    plans: list[tuple[int, list[int]]] = []  # per plan_many call: (plans, tokens of each)
    plan_many = expert.Dispatch.plan_many.__func__

    def spy(cls, ids_list, num_experts, group=None):
        plans.append((len(ids_list), [ids.shape[0] for ids in ids_list]))
        return plan_many(cls, ids_list, num_experts, group)

    expert.Dispatch.plan_many = classmethod(spy)
    model = shard_model(load_model(main, device=ctx.device, dtype="float32"), expert_parallel=ep)
    picks = []
    for m in model.modules():
        if isinstance(m, Indexer):
            m.register_forward_hook(lambda mod, args, out: picks.append(out.tolist()))
    attn, ffn = model.layers[1].attn, model.layers[0].ffn
    local = {"heads": attn.heads, "groups": attn.groups, "sinks": attn.attn_sink.numel(),
             "experts": tuple(ffn.experts.w13.shape), "shared": ffn.shared_experts.w1.weight.shape[0],
             "mtp_heads": model.mtp[0].attn.heads}
    logits = model(_ids())
    forward_plans = list(plans)
    tokens = [o.token_ids for o in model.generate(PROMPTS, max_new_tokens=12, temperature=0)]
    single = model.generate(PROMPTS[0], max_new_tokens=12, temperature=0).token_ids  # T=1 decode
    spec = _speculative(model)
    identical = _same_on_every_rank((logits.tolist(), picks, tokens, single, spec))
    if ep:
        refusals = [_refusal(lambda: shard_model(m, expert_parallel=True), m)
                    for m in [load_model(moe, device=ctx.device, dtype="float32")]]
    else:
        refusals = [_refusal(lambda: shard_model(model)), *[
            _refusal(lambda: shard_model(m), m) for m in [load_model(p, device=ctx.device, dtype="float32")
                                                         for p in (groups, moe)]]]
    return {"logits": logits, "tokens": tokens, "single": single, "spec": spec, "local": local,
            "plans": forward_plans, "identical": identical, "refusals": refusals}


@pytest.fixture(scope="module")
def reference(ckpts):
    ref = load_model(ckpts[0], device="cpu", dtype="float32")
    return {"logits": ref(_ids()), "config": ref.config,
            "tokens": [o.token_ids for o in ref.generate(PROMPTS, max_new_tokens=12, temperature=0)],
            "single": ref.generate(PROMPTS[0], max_new_tokens=12, temperature=0).token_ids}


@pytest.mark.parametrize("ep", [False, True], ids=["tp_moe", "expert_parallel"])
def test_tp2_matches_single_process(ckpts, reference, ep):
    got = run_parallel(_worker, WORLD, (*ckpts, ep), timeout=120)
    cfg = reference["config"]
    heads, inter = cfg["num_attention_heads"] // WORLD, cfg["moe_intermediate_size"]
    experts = (cfg["n_routed_experts"] // WORLD, 2 * inter, cfg["hidden_size"]) if ep else \
        (cfg["n_routed_experts"], 2 * inter // WORLD, cfg["hidden_size"])
    assert got["local"] == {"heads": heads, "groups": cfg["o_groups"] // WORLD, "sinks": heads,
                            "experts": experts, "shared": inter // WORLD, "mtp_heads": heads}
    rel = (got["logits"] - reference["logits"]).abs().max() / reference["logits"].abs().max()
    assert rel <= 1e-5, rel
    assert got["tokens"] == reference["tokens"]
    assert got["single"] == reference["single"]
    assert got["spec"] == reference["tokens"]
    assert got["identical"]
    if ep:
        # One forward of 2 x 37 tokens, 37 per rank: the 2 hash layers planned together, first;
        # then the other 2 layers plan for themselves.
        assert got["plans"] == [(2, [37, 37]), (1, [37]), (1, [37])]
        assert got["refusals"] == ["expert parallelism over 2 ranks needs n_routed_experts divisible by 2, got 3"]
    else:
        assert got["plans"] == []
        assert got["refusals"] == [
            "model is already sharded",
            "tensor parallelism over 2 ranks needs o_groups divisible by 2, got 1",
            "tensor parallelism over 2 ranks needs moe_intermediate_size divisible by 2, got 33"]


def test_needs_a_process_group(ckpts):
    model = load_model(ckpts[0], device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="initialised torch.distributed process group"):
        shard_deepseek_v4(model)
