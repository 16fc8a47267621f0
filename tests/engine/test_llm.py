"""The offline API: LLM(path).generate(prompts, SamplingParams) in order, all engine options."""
from __future__ import annotations

import pytest

from hwinfer.engine import LLM, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_checkpoint("qwen3_5", tmp_path_factory.mktemp("llm"))


def test_generate_batch_in_order_and_options_agree(path):
    prompts = ["Hello there", "The quick brown fox", "def add(a, b):", [5, 6, 7, 8]]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    plain = LLM(path, device="cpu", max_num_seqs=2).generate(prompts, params)
    assert [o.prompt_ids for o in plain][3] == [5, 6, 7, 8] and all(len(o.token_ids) == 6 for o in plain)
    for kw in ({"enable_prefix_caching": True}, {"num_speculative_tokens": 2}):
        llm = LLM(path, device="cpu", max_num_seqs=4, **kw)
        assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in plain]
        if llm.engine.prefix is not None:
            llm.engine.prefix.clear()
        assert llm.engine.pool.is_empty()


def test_per_prompt_params_and_bad_input(path):
    llm = LLM(path, device="cpu")
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                                     SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)])
    assert [len(o.token_ids) for o in outs] == [2, 5]
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0.0)
