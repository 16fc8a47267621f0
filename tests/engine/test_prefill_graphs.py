"""The fixed-size prefill path that CUDA graphs replay (hwinfer.engine.prefill_graphs), run
eagerly on the CPU: a request padded to its token bucket by a second, padding sequence gives the
tokens of the eager engine, whether it fills its bucket exactly (an empty padding sequence),
needs padding, or is longer than the largest bucket (its first chunk replayed, the rest eager).
A model whose prefill reads the host's token counts is refused up front, or, if it declares
itself graph-safe wrongly, switched off at the warm-up with the site named, and runs eagerly.
With ``HWINFER_TEST_DEVICE=cuda`` the same tests capture and replay real CUDA graphs (fp32)."""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.prefill_graphs import UnfixedLengths, bucket_sizes
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models.oracle import DEVICE, DTYPE

GRAPH_SAFE = ["qwen3_5", "kimi_linear", "kimi_k3", "glm_moe_dsa", "hy_v4", "minimax_m3", "gemma4",
              "deepseek_v4"]
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True)


def _model(arch: str, tmp_path_factory):
    path = write_checkpoint(arch, tmp_path_factory.mktemp(arch))
    return load_model(path, device=DEVICE, dtype=DTYPE)


@pytest.fixture(scope="module", params=GRAPH_SAFE)
def model(request, tmp_path_factory):
    return _model(request.param, tmp_path_factory)


def _prompts(model) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    # buckets [128, 256]: padded, exactly a bucket, padded in the larger one, longer than both
    return [torch.randint(3, model.config["vocab_size"], (k,), generator=gen).tolist()
            for k in (5, 128, 201, 300)]


def _run(model, prompts, params, **kw):
    engine = Engine(model, max_num_seqs=2, max_num_batched_tokens=256, num_blocks=96, **kw)
    outs = []
    for p in prompts:   # one at a time: each prefill is a one-request step
        outs.append(engine.run([engine.add_request(p, params)])[0].token_ids)
    assert engine.pool.is_empty() or engine.prefix is not None   # the prefix cache keeps blocks
    return outs, engine


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_fixed_size_prefill_equals_eager(model, params):
    prompts = _prompts(model)
    expected, _ = _run(model, prompts, params)
    got, engine = _run(model, prompts, params, prefill_graphs=True)
    assert got == expected
    graphs = engine.prefill_graphs
    assert graphs.disabled is None and graphs.sizes == [128, 256]
    assert graphs.replays == 4   # the 300-token prompt's second chunk runs eagerly


def test_batched_and_continued_steps_stay_eager(model):
    """Two prompts scheduled together and a prefill after a cached prefix do not fit."""
    prompts = _prompts(model)[:2]
    engine = Engine(model, max_num_seqs=2, max_num_batched_tokens=256, num_blocks=96,
                    prefill_graphs=True)
    outs = [o.token_ids for o in engine.run([engine.add_request(p, GREEDY) for p in prompts])]
    expected, _ = _run(model, prompts, GREEDY)
    assert outs == expected
    assert engine.prefill_graphs.replays == 0


def test_models_reading_host_lengths(tmp_path_factory):
    """A model whose forward reads the host's new-token counts (every model hwinfer ships
    reads device values only, so one is made: Qwen3.5 with a layer-like read of them)."""
    model = _model("qwen3_5", tmp_path_factory)

    class ReadsHostLengths(type(model)):
        graph_prefill = False

        def forward_batch(self, batch):
            assert sum(batch.new_lens) == batch.input_ids.shape[0]   # a host read
            return super().forward_batch(batch)

    model.__class__ = ReadsHostLengths
    with pytest.raises(ValueError, match="graph_prefill"):
        Engine(model, prefill_graphs=True)
    # Declared graph-safe by mistake: the warm-up reads the lengths, graphs go off with the
    # site named, and the step runs eagerly with the same tokens.
    ReadsHostLengths.graph_prefill = True
    prompts = _prompts(model)[:2]
    expected, _ = _run(model, prompts, GREEDY)
    got, engine = _run(model, prompts, GREEDY, prefill_graphs=True)
    assert got == expected
    assert "new-token counts" in engine.prefill_graphs.disabled
    assert engine.prefill_graphs.replays == 0


def test_unfixed_lengths_and_buckets():
    lengths = UnfixedLengths(2)
    assert len(lengths) == 2
    for read in (list, lambda x: x[0], sum, lambda x: [n for n in x], lambda x: x == [0, 0]):
        with pytest.raises(RuntimeError, match="new-token counts"):
            read(lengths)
    with pytest.raises(ValueError):   # not a sequence torch can read silently
        torch.tensor(lengths)
    assert bucket_sizes(256) == [128, 256]
    assert bucket_sizes(1000) == [128, 256, 512, 1000]
    assert bucket_sizes(64) == [64]


def test_with_decode_graphs_and_prefix_caching(tmp_path_factory):
    """Prefill graphs next to decode graphs (they share the padding slot) and prefix caching
    (the state checkpoint at a chunk boundary is taken after the replayed step)."""
    model = _model("qwen3_5", tmp_path_factory)
    prompts = _prompts(model)
    shared = prompts[2][:192]
    prompts = [shared + prompts[0], shared + prompts[1][:40], prompts[3]]
    kw = dict(cuda_graphs=True, enable_prefix_caching=True, prefix_chunk_tokens=64)
    expected, _ = _run(model, prompts, GREEDY, **kw)
    got, engine = _run(model, prompts, GREEDY, prefill_graphs=True, **kw)
    assert got == expected
    assert engine.prefill_graphs.disabled is None and engine.prefill_graphs.replays >= 2
    assert engine.graphs.replays > 0
