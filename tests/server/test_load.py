"""Bounded load: many concurrent streaming clients, some leaving early; everything completes or
is cancelled and the cache pool ends empty."""
from __future__ import annotations

import asyncio

import httpx
import openai

from tests.server.conftest import API_KEY, engine_idle

CLIENTS = 24


async def _one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
    leave_early = i % 3 == 0
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=12 if not leave_early else 64,
        temperature=0.8, seed=i, stream=True, extra_body={"ignore_eos": leave_early})
    reason = None
    async with stream:
        async for chunk in stream:
            if leave_early and chunk.choices and chunk.choices[0].delta.content:
                return "left", None
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
    return "done", reason


def test_concurrent_streams_with_disconnects(server):
    async def main():
        async with openai.AsyncOpenAI(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=60) as client:
            return await asyncio.gather(*(_one(client, i) for i in range(CLIENTS)))
    results = asyncio.run(main())
    assert sum(r == ("left", None) for r in results) == CLIENTS // 3
    assert all(reason in ("stop", "length") for kind, reason in results if kind == "done")
    assert engine_idle(server)
    metrics = httpx.get(server.url + "/metrics").text
    aborted = [line for line in metrics.splitlines() if line.startswith('hwinfer_requests_total{finish_reason="abort"}')]
    assert aborted and float(aborted[0].split()[-1]) >= 1


def _aborted(server) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith('hwinfer_requests_total{finish_reason="abort"}'):
            return float(line.split()[-1])
    return 0.0


def test_disconnect_frees_the_cache_mid_stream(server):
    before = _aborted(server)
    with httpx.stream("POST", server.base + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "tiny", "prompt": "long", "max_tokens": 200, "stream": True,
                            "ignore_eos": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    assert engine_idle(server, timeout=10)
    assert _aborted(server) == before + 1
