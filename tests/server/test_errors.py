"""Errors in the OpenAI format with OpenAI's status codes; the API key; body size; loading."""
from __future__ import annotations

import threading

import httpx
import openai
import pytest

from hwinfer.server.state import ServerConfig, ServerState
from tests.server.conftest import API_KEY, MAX_BODY, engine_idle, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_malformed_json_is_400(server):
    r = httpx.post(server.base + "/chat/completions", headers={**AUTH, "content-type": "application/json"},
                   content=b'{"model": "tiny", "messages": [')
    assert _error(r, 400)["type"] == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-nothing", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nothing")


def test_prompt_longer_than_context_is_400(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny", prompt=[5] * 300, max_tokens=4)
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[5] * 200, max_tokens=100)


@pytest.mark.parametrize("bad", [
    {"temperature": 3.0}, {"top_p": 0.0}, {"n": 0}, {"max_tokens": 0}, {"stop": ["a", "b", "c", "d", "e"]},
    {"top_logprobs": 21, "logprobs": True}, {"top_logprobs": 2}, {"top_logprobs": -1, "logprobs": True},
    {"logprobs": "many"}, {"frequency_penalty": 1.0},
    {"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
])
def test_invalid_parameters_are_400(server, bad):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **bad}
    err = _error(httpx.post(server.base + "/chat/completions", headers=AUTH, json=body), 400)
    assert err["type"] == "invalid_request_error"


def test_out_of_vocabulary_tokens_are_400(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[1, 10 ** 6], max_tokens=2)


def test_api_key_required(server):
    with openai.OpenAI(base_url=server.base, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert _error(httpx.get(server.base + "/models"), 401)["type"] == "authentication_error"
    assert httpx.get(server.url + "/health").status_code == 200


def test_body_size_limit_is_413(server):
    big = {"model": "tiny", "prompt": "x" * (MAX_BODY + 10), "max_tokens": 1}
    _error(httpx.post(server.base + "/completions", headers=AUTH, json=big), 413)


def test_unknown_route_is_404_in_openai_format(server):
    _error(httpx.get(server.base + "/nothing-here", headers=AUTH), 404)
    assert engine_idle(server)


def test_health_is_503_while_loading(checkpoint, monkeypatch):
    release = threading.Event()
    original = ServerState.load

    def slow_load(self):
        release.wait(30)
        original(self)
    monkeypatch.setattr(ServerState, "load", slow_load)
    running = start_server(ServerConfig(model_path=str(checkpoint), device="cpu", cache_bytes=4 << 20),
                           wait_ready=False)
    try:
        assert _error(httpx.get(running.url + "/health"), 503)["code"] == "model_loading"
        assert httpx.get(running.base + "/models").status_code == 503
        release.set()
        assert running.state.ready.wait(30)
        assert httpx.get(running.url + "/health").status_code == 200
    finally:
        release.set()
        running.stop()
