"""Speculative decoding with the checkpoints' MTP layers: output identical to plain decoding
(greedy and seeded sampling, batched, chunked, preempted, with prefix caching), whatever the
drafts: random MTP weights (almost nothing accepted), perfect drafts (everything accepted, k + 1
tokens per verify) and drafts wrong at a varying place (every rollback depth). The pool is
empty after every run and the acceptance counters add up."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.drafter import DraftJob
from hwinfer.testing.checkpoints import write_checkpoint

ARCHS = ["qwen3_5", "qwen3_5_moe", "deepseek_v4"]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=321, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    return load_model(write_checkpoint(request.param, tmp_path_factory.mktemp(request.param)), device="cpu")


def _prompts(model) -> list[list[int]]:
    """Lengths across DeepSeek-V4's windows (sliding 8, CSA 4, HCA 8) and Qwen3.5's 64-token
    GDN chunks; decoding 12 tokens crosses more of both."""
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, model.config["vocab_size"], (k,), generator=gen).tolist() for k in (5, 70, 29, 131, 60)]


def _run(model, prompts, params, k=0, drafter=None, **kw) -> tuple[Engine, list[list[int]]]:
    """Two requests first, the rest once those are decoding: verifies mix with prefill chunks."""
    kw = {"max_num_seqs": 3, "max_num_batched_tokens": 48, "num_blocks": 128, **kw}
    engine = Engine(model, num_speculative_tokens=k, **kw)
    if drafter is not None:
        engine.spec.drafter = drafter
    reqs = [engine.add_request(p, params) for p in prompts[:2]]
    for _ in range(4):
        engine.step()
    reqs += [engine.add_request(p, params) for p in prompts[2:]]
    outs = engine.run(reqs)
    assert engine.pool.is_empty() or engine.prefix is not None
    return engine, [o.token_ids for o in outs]


def _check_counters(engine: Engine, k: int) -> None:
    st = engine.spec_stats()
    assert 0 <= st.accepted <= st.drafted <= k * st.verify_steps
    # No stop tokens: every verify emits its accepted drafts plus the bonus token.
    assert st.emitted == st.accepted + st.verify_steps
    assert 0.0 <= st.acceptance_rate <= 1.0


class Oracle:
    """Test drafter: the target's own tokens (known from a plain run), wrong from the
    ``(len(output) % (k + 1))``-th draft on when ``corrupt`` (so every rollback depth 0..k
    occurs). Counts the drafts that are right up to the first wrong one."""

    def __init__(self, prompts, expected, vocab: int, k: int, corrupt: bool) -> None:
        self.expected = {tuple(p): e for p, e in zip(prompts, expected)}
        self.vocab, self.k, self.corrupt = vocab, k, corrupt
        self.right: dict[tuple[str, int], int] = {}

    def propose(self, batch, mtp_input, jobs: list[DraftJob], sample) -> list[list[int]]:
        out = []
        for job in jobs:
            done = len(job.req.output_ids)
            drafts = list(self.expected[tuple(job.req.prompt_ids)][done:done + job.want])
            bad = done % (self.k + 1) if self.corrupt else len(drafts)
            for j in range(bad, len(drafts)):
                drafts[j] = (drafts[j] + 1 + j) % self.vocab
            self.right[(job.req.id, job.req.num_tokens)] = min(bad, len(drafts))
            out.append(drafts)
        return out


def test_speculation_on_equals_off_greedy(model):
    prompts = _prompts(model)
    _, expected = _run(model, prompts, GREEDY)
    for k in (1, 3):
        engine, got = _run(model, prompts, GREEDY, k=k)
        assert got == expected
        _check_counters(engine, k)
        assert engine.spec_stats().verify_steps > 0


def test_speculation_on_equals_off_sampled(model):
    prompts = _prompts(model)[:3]
    _, expected = _run(model, prompts, SAMPLED)
    engine, got = _run(model, prompts, SAMPLED, k=2)
    assert got == expected
    _check_counters(engine, 2)


@pytest.mark.parametrize("corrupt", [False, True], ids=["perfect", "wrong-at-varying-depth"])
def test_oracle_drafts_exercise_bonus_and_rollback(model, corrupt):
    prompts, k = _prompts(model), 4
    _, expected = _run(model, prompts, GREEDY)
    oracle = Oracle(prompts, expected, model.config["vocab_size"], k, corrupt)
    # A budget that never cuts a proposal short, so each one is verified in full.
    engine, got = _run(model, prompts, GREEDY, k=k, drafter=oracle, max_num_batched_tokens=512)
    assert got == expected
    _check_counters(engine, k)
    st = engine.spec_stats()
    # Every proposal was verified in full (budget and blocks were ample): the engine accepted
    # exactly the drafts that were right.
    assert st.accepted == sum(oracle.right.values())
    if not corrupt:
        assert st.accepted == st.drafted > 0
        # First token from the prefill, then k + 1 per verify until max_tokens leaves less room.
        full, rest = divmod(GREEDY.max_tokens - 1, k + 1)
        assert st.verify_steps == len(prompts) * (full + (rest > 1))
    else:
        assert 0 < st.accepted < st.drafted


def test_stop_token_inside_accepted_drafts(model, monkeypatch):
    prompts = _prompts(model)[:3]
    _, long = _run(model, prompts, GREEDY)
    # With perfect drafts and k = 3, output indices 5..7 are drafts of the second verify: make
    # the first of them that is new in request 0's output its end-of-sequence token.
    at = next((i for i in (5, 6, 7) if long[0][i] not in long[0][:i]), None)
    if at is None:
        pytest.skip("no fresh token at a draft position in this fixture")
    monkeypatch.setattr(model, "generation_defaults",
                        dataclasses.replace(model.generation_defaults, eos_token_ids=(long[0][at],)))
    params = dataclasses.replace(GREEDY, ignore_eos=False)
    _, expected = _run(model, prompts, params)
    assert expected[0] == long[0][:at]
    oracle = Oracle(prompts, long, model.config["vocab_size"], 3, False)
    engine, got = _run(model, prompts, params, k=3, drafter=oracle, max_num_batched_tokens=512)
    assert got == expected
    st = engine.spec_stats()
    assert st.emitted < st.accepted + st.verify_steps  # a verify ended inside its accepted drafts


def test_speculation_with_preemption(model):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, model.config["vocab_size"], (n,), generator=gen).tolist() for n in (3, 29, 11, 41)]
    _, expected = _run(model, prompts, GREEDY)
    bs = model.cache_block_size()
    blocks = 2 * -(-(max(map(len, prompts)) + GREEDY.max_tokens) // bs)
    engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=blocks, num_speculative_tokens=2)
    reqs = [engine.add_request(p, GREEDY) for p in prompts]
    assert [o.token_ids for o in engine.run(reqs)] == expected
    assert engine.pool.is_empty()
    assert sum(r.num_preemptions for r in reqs) > 0


def test_speculation_with_prefix_caching(model):
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 512, (40,), generator=gen).tolist()
    prompts = [shared + torch.randint(3, 512, (n,), generator=gen).tolist() for n in (3, 9, 30)]
    _, expected = _run(model, prompts, GREEDY)
    engine, got = _run(model, prompts, GREEDY, k=2, enable_prefix_caching=True, prefix_chunk_tokens=16,
                       prefix_checkpoints=8)
    assert got == expected
    assert engine.prefix.stats.hit_tokens > 0
    engine.prefix.clear()
    assert engine.pool.is_empty()


def test_rings_have_room_for_drafts(model):
    engine = Engine(model, max_num_seqs=2, num_blocks=16, num_speculative_tokens=3)
    plain = model.cache_specs()
    layers = engine.pool.cache.layers
    assert len(layers) == len(plain) + 1  # the MTP layer's own cache
    for specs, layer in zip(plain, layers):
        for s in specs:
            if s.per == "ring":
                assert layer[s.name].shape[1] >= s.rows + 3


def test_models_without_mtp_refuse(tmp_path):
    model = load_model(write_checkpoint("kimi_linear", tmp_path), device="cpu")
    with pytest.raises(ValueError, match="MTP"):
        Engine(model, num_blocks=8, num_speculative_tokens=2)


@pytest.mark.parametrize("budget", [512, 7], ids=["one-prefill", "chunked"])
def test_mtp_drafts_equal_an_uncached_mtp_forward(model, budget):
    """The drafter's cached MTP path (cache filled over prefill chunks, then chained draft
    steps on the MTP's own hidden) equals the MTP run without a cache over the whole sequence."""
    from hwinfer.runtime.batch import ForwardBatch

    prompt, k = _prompts(model)[2], 3
    engine = Engine(model, max_num_seqs=1, max_num_batched_tokens=budget, num_blocks=32, num_speculative_tokens=k)
    req = engine.add_request(prompt, GREEDY)
    while not req.output_ids:
        engine.step()
    got = engine.spec.drafts[req.id][1]
    ids = req.all_ids  # prompt + the first sampled token
    with torch.no_grad():
        _, state = model.forward_batch_mtp(ForwardBatch.full(torch.tensor(ids[:-1]), [len(ids) - 1]))
        tokens, drafts = list(ids[1:]), []
        for _ in range(k):
            head, out = model.mtp_forward(state, ForwardBatch.full(torch.tensor(tokens), [len(tokens)]))
            drafts.append(int(model.logits(head[-1:]).argmax(-1)))
            state, tokens = torch.cat((state, out[-1:])), tokens + [drafts[-1]]
    assert got == drafts
    engine.abort(req.id)
    assert engine.pool.is_empty()
