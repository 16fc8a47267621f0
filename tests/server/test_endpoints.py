"""Every endpoint through the real openai client (and httpx where the client has no method)."""
from __future__ import annotations

import httpx

from tests.server.conftest import API_KEY, engine_idle

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]


def test_health_and_models(server, client):
    assert httpx.get(server.url + "/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_completion_greedy_is_deterministic_and_counts_usage(client):
    a = client.completions.create(model="tiny", prompt="Hello there", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    b = client.completions.create(model="tiny", prompt="Hello there", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert a.choices[0].text == b.choices[0].text and a.choices[0].finish_reason == "length"
    assert a.object == "text_completion" and a.usage.completion_tokens == 6
    assert a.usage.total_tokens == a.usage.prompt_tokens + 6


def test_completion_batch_token_prompt_n_and_seed(client):
    r = client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=3, n=2, seed=7, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.usage.completion_tokens <= 12
    again = client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=3, n=2, seed=7,
                                      temperature=1.0)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    tokens = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=2)
    assert tokens.usage.prompt_tokens == 3


def test_completion_stream_matches_non_stream(client):
    kw = dict(model="tiny", prompt="The quick brown fox", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_stop_strings_cut_the_text(client):
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    stops = [text[i:i + 2] for i in range(1, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isalpha()]
    assert stops, f"no ascii stop candidate in {text!r}"
    cut = client.completions.create(stop=[stops[0]], **kw).choices[0]
    assert cut.text == text[:text.find(stops[0])] and cut.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=stops[0], stream=True, **kw))
    assert streamed == cut.text


def test_chat_completion_and_limits(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_completion_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    two = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, n=2, top_p=0.9, seed=3)
    assert len(two.choices) == 2 and two.usage.completion_tokens <= 8


def test_chat_stream_with_usage_and_done(server, client):
    kw = dict(model="tiny", messages=CHAT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 6 and all(c.usage is None for c in chunks[:-1])
    raw = httpx.post(server.base + "/chat/completions", headers=AUTH, json={**kw, "stream": True}, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_responses(client):
    r = client.responses.create(model="tiny", input="Hi", instructions="Be brief.", max_output_tokens=4)
    assert r.object == "response" and r.usage.output_tokens <= 4 and isinstance(r.output_text, str)
    events = list(client.responses.create(model="tiny", input=[{"role": "user", "content": "Hi"}],
                                          max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text


def test_tokenize_detokenize(server):
    r = httpx.post(server.url + "/tokenize", headers=AUTH, json={"model": "tiny", "prompt": "Hello world"})
    body = r.json()
    assert r.status_code == 200 and body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 256
    back = httpx.post(server.url + "/detokenize", headers=AUTH, json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    chat = httpx.post(server.url + "/tokenize", headers=AUTH, json={"messages": CHAT}).json()
    assert chat["count"] > body["count"]


def test_metrics(server, client):
    client.completions.create(model="tiny", prompt="metrics", max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    for name in ("hwinfer_requests_total", "hwinfer_prompt_tokens_total", "hwinfer_generation_tokens_total",
                 "hwinfer_time_to_first_token_seconds_bucket", "hwinfer_time_per_output_token_seconds_bucket",
                 "hwinfer_num_requests_waiting", "hwinfer_num_requests_running", "hwinfer_cache_usage_ratio"):
        assert name in text, name
    assert engine_idle(server)
