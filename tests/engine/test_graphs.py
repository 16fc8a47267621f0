"""The fixed-size decode path that CUDA graphs replay (hwinfer.engine.graphs), run eagerly on the
CPU: padding rows, static input buffers and per-slot block tables never change a token, across
batch sizes that need padding, requests that join and leave, and preemption. With
``HWINFER_TEST_DEVICE=cuda`` the same tests capture and replay real CUDA graphs (fp32), which
checks that replay gives the tokens of eager decode on the GPU.)"""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.graphs import capture_sizes
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models.oracle import DEVICE, DTYPE

ARCHS = ["qwen3_5", "gemma4", "kimi_linear", "deepseek_v4", "glm_moe_dsa", "hy_v4", "minimax_m3"]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    path = write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return load_model(path, device=DEVICE, dtype=DTYPE)


def _prompts(model, n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, model.config["vocab_size"], (k,), generator=gen).tolist()
            for k in [5, 23, 9, 40, 14][:n]]


def _run(model, prompts, params, **kw):
    engine = Engine(model, max_num_seqs=5, max_num_batched_tokens=32, num_blocks=64, **kw)
    reqs = [engine.add_request(p, params) for p in prompts[:2]]
    engine.step()
    reqs += [engine.add_request(p, params) for p in prompts[2:]]
    outs = [o.token_ids for o in engine.run(reqs)]
    assert engine.pool.is_empty()
    return outs, engine


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_fixed_size_decode_equals_eager(model, params):
    prompts = _prompts(model, 5)
    expected, _ = _run(model, prompts, params, cuda_graphs=False)
    got, engine = _run(model, prompts, params, cuda_graphs=True)
    assert got == expected
    assert engine.graphs is not None and engine.graphs.disabled is None
    # Sizes 1, 2, 4, 5: three running requests run padded to 4.
    assert engine.graphs.sizes == [1, 2, 4, 5]
    assert engine.graphs.replays > 0


def test_requests_longer_than_the_graph_table_decode_eagerly(model):
    prompts = _prompts(model, 3)
    expected, _ = _run(model, prompts, GREEDY, cuda_graphs=False)
    bs = model.cache_block_size()
    got, engine = _run(model, prompts, GREEDY, cuda_graphs=True, graph_max_len=2 * bs)
    assert engine.graphs.width == 2
    assert got == expected


def test_preempted_requests_get_fresh_table_rows(model):
    prompts = _prompts(model, 4)
    bs = model.cache_block_size()
    blocks = 2 * -(-(max(map(len, prompts)) + GREEDY.max_tokens) // bs)
    outs = []
    for graphs in (False, True):
        engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=blocks, cuda_graphs=graphs)
        outs.append([o.token_ids for o in engine.run([engine.add_request(p, GREEDY) for p in prompts])])
        assert engine.pool.is_empty()
    assert outs[0] == outs[1]


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(256)[-4:] == [160, 192, 224, 256]


def test_models_without_a_graph_safe_decode_are_refused(tmp_path):
    # Every architecture declares a graph-safe decode now; a model that does not (as the
    # tensor-parallel proxies do) is refused rather than replayed wrongly.
    model = load_model(write_checkpoint("qwen3_5", tmp_path), device=DEVICE, dtype=DTYPE)
    model.graph_decode = False
    with pytest.raises(ValueError, match="graph_decode"):
        Engine(model, max_num_seqs=2, num_blocks=16, cuda_graphs=True)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_overlapped_decode_equals_one_step_at_a_time(model, params):
    """Graph decode steps overlapped with the host (the next step's input token taken from the
    device) give the tokens of steps run one at a time, with requests joining mid-stream (which
    drains the step in flight)."""
    prompts = _prompts(model, 5)
    expected, _ = _run(model, prompts, params, cuda_graphs=True, overlap=False)
    got, engine = _run(model, prompts, params, cuda_graphs=True)
    assert got == expected
    assert engine.overlapped_steps > 0
    # Greedy steps take the graph's own argmax (none sampled on the side); sampled steps never.
    # The captures that new sizes need while a step is in flight must keep its tokens: the
    # requests' different prompt lengths make those happen here.
    assert (engine.graphs.greedy_steps > 0) == (params is GREEDY)


def test_overlap_with_uneven_lengths_aborts_and_logprobs(tmp_path):
    """Requests ending at different steps (one token in flight for an already-finished request
    is dropped), an abort while a step is in flight, and a request asking for logprobs (which
    turns overlap off for the steps it is in): the same tokens as one step at a time."""
    model = load_model(write_checkpoint("qwen3_5", tmp_path / "m"), device=DEVICE, dtype=DTYPE)
    prompts = _prompts(model, 4)
    lengths = [3, 9, 1, 6]
    outs = []
    for overlap in (False, True):
        engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=64,
                        cuda_graphs=True, overlap=overlap)
        reqs = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
                for p, n in zip(prompts, lengths)]
        victim = engine.add_request(prompts[0], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
        for _ in range(4):
            engine.step()
        engine.abort(victim.id)
        late = engine.add_request(prompts[1], SamplingParams(max_tokens=5, temperature=0, logprobs=2,
                                                             ignore_eos=True))
        result = [o.token_ids for o in engine.run(reqs + [late])]
        assert [len(t) for t in result] == lengths + [5]
        assert len(engine.output(late).logprobs) == 5
        assert victim.status.value == "finished" and victim.finish_reason == "abort"
        while engine.has_unfinished():
            engine.step()
        engine.step()   # drains a step left in flight
        assert engine.pool.is_empty() and all(r.inflight == 0 for r in reqs + [victim, late])
        outs.append((result, len(victim.output_ids) <= 4))
        if overlap:
            assert engine.overlapped_steps > 0
    assert outs[0][0] == outs[1][0]
