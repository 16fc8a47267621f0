"""logprobs / top_logprobs on /v1/chat/completions and /v1/completions, through the real openai
client: the values are the loaded model's own log_softmax, streamed and not."""
from __future__ import annotations

import httpx
import pytest
import torch

from hwinfer import load_model
from tests.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "user", "content": "Count to three"}]
GREEDY = dict(model="tiny", temperature=0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def reference(checkpoint):
    """The served checkpoint loaded again (fp32, CPU), for an independent full forward."""
    model = load_model(checkpoint, device="cpu", dtype="float32")

    def logprobs(prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
        logits = model.forward(torch.tensor(prompt_ids + output_ids)).float()
        return torch.log_softmax(logits, dim=-1)[len(prompt_ids) - 1:-1]
    return model, logprobs


def _token_ids(model, entries) -> list[int]:
    """Token ids back from each entry's bytes (byte-level BPE: bytes -> text -> encode is exact
    only for whole characters, so match each entry's bytes against the vocabulary)."""
    tok = model.tokenizer
    table = {bytes(tok.token_bytes(i)): i for i in range(tok.vocab_size)}
    return [table[bytes(e.bytes)] for e in entries]


def _check_chat(entries, model, ref, prompt_ids, n_top):
    ids = _token_ids(model, entries)
    lp = ref(prompt_ids, ids)
    for pos, e in enumerate(entries):
        assert e.logprob == pytest.approx(float(lp[pos, ids[pos]]), abs=1e-4)
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == n_top and tops == sorted(tops, reverse=True)
        assert e.top_logprobs[0].bytes == e.bytes and tops[0] == pytest.approx(e.logprob, abs=1e-6)
        assert tops[-1] == pytest.approx(float(lp[pos].topk(n_top).values[-1]), abs=1e-4)


def test_chat_logprobs(server, client, reference):
    model, ref = reference
    prompt_ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(CHAT), add_special_tokens=False)
    r = client.chat.completions.create(messages=CHAT, max_tokens=6, logprobs=True, top_logprobs=3, **GREEDY)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 6 and "".join(e.token for e in entries) == r.choices[0].message.content
    _check_chat(entries, model, ref, prompt_ids, 3)
    chunks = list(client.chat.completions.create(messages=CHAT, max_tokens=6, logprobs=True, top_logprobs=3,
                                                 stream=True, **GREEDY))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    plain = client.chat.completions.create(messages=CHAT, max_tokens=6, **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content
    only = client.chat.completions.create(messages=CHAT, max_tokens=3, logprobs=True, **GREEDY)
    assert all(e.top_logprobs == [] for e in only.choices[0].logprobs.content)


def test_completion_logprobs(server, client, reference):
    model, ref = reference
    prompt = "Once upon a time"
    prompt_ids = model.tokenizer.encode(prompt)
    r = client.completions.create(prompt=prompt, max_tokens=6, logprobs=2, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    raw = httpx.post(server.base + "/completions", headers=AUTH, timeout=30,
                     json={"model": "tiny", "prompt": prompt, "max_tokens": 6, "logprobs": 2, "temperature": 0,
                           "ignore_eos": True}).json()
    assert raw["choices"][0]["logprobs"]["token_logprobs"] == lp.token_logprobs
    greedy: list[int] = []  # decode greedily with full forwards, independently of the engine
    for _ in range(6):
        greedy.append(int(model.forward(torch.tensor(prompt_ids + greedy))[-1].argmax()))
    assert lp.tokens == [model.tokenizer.decode([t], skip_special_tokens=False) for t in greedy]
    ref_lp = ref(prompt_ids, greedy)
    for pos, value in enumerate(lp.token_logprobs):
        assert value == pytest.approx(float(ref_lp[pos, greedy[pos]]), abs=1e-4)
    for pos, top in enumerate(lp.top_logprobs):
        values = list(top.values())
        assert values == sorted(values, reverse=True) and 1 <= len(values) <= 2
        assert max(values) == pytest.approx(lp.token_logprobs[pos], abs=1e-6)  # greedy: the top one
    chunks = list(client.completions.create(prompt=prompt, max_tokens=6, logprobs=2, stream=True, **GREEDY))
    streamed = [(t, v, o) for c in chunks if c.choices and c.choices[0].logprobs
                for t, v, o in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs,
                                   c.choices[0].logprobs.text_offset)]
    assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))


@pytest.mark.parametrize("bad", [{"logprobs": 6}, {"logprobs": -1}, {"logprobs": "x"}])
def test_completion_bad_logprobs_are_400(server, bad):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, **bad}
    r = httpx.post(server.base + "/completions", headers=AUTH, json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
