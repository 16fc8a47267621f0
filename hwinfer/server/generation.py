"""What the generating endpoints share: prompt checks, submitting choices, merging their streams,
SSE framing and aborting on disconnect."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from starlette.requests import Request as HTTPRequest

from hwinfer.engine.request import SamplingParams
from hwinfer.server.engine_handle import Delta, EngineFailure, Stream
from hwinfer.server.protocol import ServerError
from hwinfer.server.state import ServerState


def resolve_max_tokens(state: ServerState, prompt_len: int, requested: int | None, param: str) -> int:
    """The number of tokens to generate; 400 when the prompt (plus the request) exceeds the context."""
    limit = state.max_model_len
    if prompt_len >= limit or (requested is not None and prompt_len + requested > limit):
        asked = prompt_len + (requested or 0)
        raise ServerError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{asked} tokens ({prompt_len} in the prompt, {requested or 0} for the completion). "
                               "Please reduce the length of the prompt or the completion.",
                          param=param, code="context_length_exceeded")
    return requested if requested is not None else limit - prompt_len


def make_params(max_tokens: int, *, temperature: float | None, top_p: float | None, top_k: int | None = None,
                seed: int | None, stop: list[str], ignore_eos: bool = False, choice: int = 0,
                logprobs: int | None = None) -> SamplingParams:
    """SamplingParams for one choice; choices of one request get seeds seed, seed+1, ..."""
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=None if seed is None else seed + choice, stop=stop, ignore_eos=ignore_eos,
                          logprobs=logprobs)


async def submit_all(state: ServerState, jobs: list[tuple[list[int], SamplingParams]], prefix: str) -> list[Stream]:
    """Submit every choice; if the engine refuses one, abort those already queued and answer 400."""
    streams: list[Stream] = []
    try:
        for ids, params in jobs:
            streams.append(await state.handle.submit(ids, params, prefix))
    except ValueError as exc:
        abort_unfinished(state, streams)
        raise ServerError(400, str(exc), param="prompt") from None
    except BaseException:
        abort_unfinished(state, streams)
        raise
    return streams


def abort_unfinished(state: ServerState, streams: list[Stream]) -> None:
    for s in streams:
        if not s.finished:
            state.handle.abort(s.request_id)
            s.finished = True


async def merge(streams: list[Stream]) -> AsyncIterator[tuple[int, Delta | EngineFailure]]:
    """Messages of several streams as they arrive, as (stream index, message)."""
    pending = {asyncio.ensure_future(s.next()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                msg = task.result()
                if isinstance(msg, EngineFailure) or msg.finish_reason is not None:
                    streams[i].finished = True
                else:
                    pending[asyncio.ensure_future(streams[i].next())] = i
                yield i, msg
    finally:
        for task in pending:
            task.cancel()


async def collect(state: ServerState, streams: list[Stream], http: HTTPRequest) -> list[Delta]:
    """Wait for every stream to finish (non-streaming answers); the last Delta of each carries the
    whole text (and every token's logprobs, when asked). A client that disconnects first aborts
    them all."""
    texts = [""] * len(streams)
    logprobs: list[list] = [[] for _ in streams]
    final: list[Delta | None] = [None] * len(streams)

    async def gather() -> None:
        async for i, msg in merge(streams):
            if isinstance(msg, EngineFailure):
                raise ServerError(500, msg.message, type="server_error")
            texts[i] += msg.text
            logprobs[i] += msg.logprobs or []
            if msg.finish_reason is not None:
                final[i] = Delta(texts[i], msg.num_prompt_tokens, msg.num_output_tokens, msg.finish_reason,
                                 logprobs[i] if msg.logprobs is not None else None)

    work = asyncio.ensure_future(gather())
    watch = asyncio.ensure_future(_wait_disconnect(http))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            raise ServerError(499, "client disconnected", type="client_error")
        work.result()
        return [d for d in final if d is not None]
    finally:
        watch.cancel()
        abort_unfinished(state, streams)


async def _wait_disconnect(http: HTTPRequest) -> None:
    while not await http.is_disconnected():
        await asyncio.sleep(0.25)


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def usage(final: list[Delta], prompt_lens: list[int]) -> dict[str, int]:
    """OpenAI usage: each distinct prompt counted once, every choice's tokens counted."""
    prompt = sum(prompt_lens)
    completion = sum(d.num_output_tokens for d in final)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(reason: str | None) -> str | None:
    return "stop" if reason == "abort" else reason


def chat_prompt_ids(state: ServerState, messages: list[dict[str, Any]], param: str) -> list[int]:
    """Render ``messages`` with the model's chat template and tokenize the result; a template
    error is the client's (400 naming ``param``)."""
    try:
        text = state.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise ServerError(400, str(exc), param=param) from None
    return state.model.tokenizer.encode(text, add_special_tokens=False)
