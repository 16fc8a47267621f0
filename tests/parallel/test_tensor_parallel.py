"""Tensor parallelism over 2 CPU processes (gloo): same logits and tokens as one process;
a failing rank fails the call quickly, naming the rank."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.parallel import RankFailed, run_parallel, shard_model
from hwinfer.testing.checkpoints import write_checkpoint
from hwinfer.testing.tiny import qwen3_5 as tiny_qwen3_5

WORLD = 2
PROMPTS = [[5, 17, 99, 3, 250], [7, 1, 300, 42, 42, 8, 19, 101, 64, 2, 77, 31, 12]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    dense = write_checkpoint("qwen3_5", root / "dense")  # the tiny qwen3_5 is dense (no num_experts)
    other = write_checkpoint("gemma4", root / "gemma4")  # an architecture TP does not cover yet
    odd = write_checkpoint("qwen3_5", root / "kv1", overrides={"text_config": {
        **tiny_qwen3_5.text_config("tiny"), "num_key_value_heads": 1}})
    return dense, other, odd


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 37), generator=torch.Generator().manual_seed(0))


def _refusal(fn) -> str:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return "not refused"


def _tp_worker(ctx, dense, other, odd):
    model = load_model(dense, device=ctx.device, dtype="float32")
    shard_model(model)
    gdn, attn = model.layers[0].linear_attn, model.layers[3].self_attn
    local = {"nk": gdn.nk, "nv": gdn.nv, "conv_dim": gdn.conv_dim, "heads": attn.heads,
             "kv_heads": attn.kv_heads, "k_cache": tuple(model.cache_specs()[3][0].shape)}
    logits = model(_ids(model.config["vocab_size"]))
    outs = model.generate(PROMPTS, max_new_tokens=12, temperature=0)
    spec = _speculative_tokens(model)
    refusals = [
        _refusal(lambda: shard_model(model)),
        _refusal(lambda: shard_model(load_model(other, device=ctx.device, dtype="float32"))),
        _refusal(lambda: shard_model(load_model(odd, device=ctx.device, dtype="float32"))),
        _refusal(lambda: shard_model(torch.nn.Linear(2, 2))),
    ]
    return {"logits": logits, "tokens": [o.token_ids for o in outs], "spec_tokens": spec,
            "local": local, "refusals": refusals}


def _speculative_tokens(model) -> list[list[int]]:
    """Greedy through the engine with the (sharded) MTP head drafting 2 tokens a step."""
    engine = Engine(model, max_num_seqs=2, num_blocks=16, num_speculative_tokens=2)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=12, temperature=0)) for p in PROMPTS]
    return [o.token_ids for o in engine.run(reqs)]


def test_tp2_matches_single_process(ckpts):
    dense, other, odd = ckpts
    ref = load_model(dense, device="cpu", dtype="float32")
    ref_logits = ref(_ids(ref.config["vocab_size"]))
    ref_tokens = [o.token_ids for o in ref.generate(PROMPTS, max_new_tokens=12, temperature=0)]

    got = run_parallel(_tp_worker, WORLD, (str(dense), str(other), str(odd)), timeout=120)

    cfg = ref.config
    assert got["local"] == {
        "nk": cfg["linear_num_key_heads"] // WORLD, "nv": cfg["linear_num_value_heads"] // WORLD,
        "conv_dim": (2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
                     + cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]) // WORLD,
        "heads": cfg["num_attention_heads"] // WORLD, "kv_heads": cfg["num_key_value_heads"] // WORLD,
        "k_cache": (cfg["num_key_value_heads"] // WORLD, cfg["head_dim"])}
    rel = (got["logits"] - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel <= 1e-5, rel
    assert got["tokens"] == ref_tokens
    assert got["spec_tokens"] == ref_tokens
    already, arch_msg, odd_msg, not_a_model = got["refusals"]
    assert "already sharded" in already
    assert "Gemma4" in arch_msg and "not supported yet" in arch_msg
    assert "num_key_value_heads divisible by 2, got 1" in odd_msg
    assert "Linear is not supported yet" in not_a_model


def _raise_on_rank_1(ctx):
    if ctx.rank == 1:
        raise RuntimeError("boom on purpose")
    dist.all_reduce(torch.ones(4))  # rank 0 waits in a collective that never completes
    return "unreachable"


def _die_on_rank_1(ctx):
    if ctx.rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))
    return "unreachable"


@pytest.mark.parametrize("fn, words", [(_raise_on_rank_1, "RuntimeError: boom on purpose"),
                                       (_die_on_rank_1, "exited with code 3")])
def test_failing_rank_is_named_quickly(fn, words):
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_parallel(fn, WORLD, timeout=60)
    assert time.monotonic() - start < 30
    assert info.value.rank == 1
    assert str(info.value).startswith("rank 1 of 2 failed") and words in str(info.value)


def _stall_rank_1(ctx):
    if ctx.rank == 1:
        time.sleep(60)  # alive, silent, never joins the collective
    dist.all_reduce(torch.ones(4))
    return "unreachable"


def test_collectives_time_out():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_parallel(_stall_rank_1, WORLD, collective_timeout=2, timeout=60)
    assert time.monotonic() - start < 30
    assert info.value.rank == 0 and "imed out" in str(info.value), str(info.value)


def _rank_sum(ctx, base):
    t = torch.tensor([float(base + ctx.rank)])
    dist.all_reduce(t)
    return ctx.rank, ctx.backend, t.item()


def test_run_parallel_returns_rank0_result():
    assert run_parallel(_rank_sum, WORLD, (10,)) == (0, "gloo", 21.0)
