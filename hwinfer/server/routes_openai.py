"""/v1/completions and /v1/chat/completions, streaming (SSE) and not."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from hwinfer.server.engine_handle import EngineFailure, Stream
from hwinfer.server.generation import (
    abort_unfinished, chat_prompt_ids, collect, finish_reason, make_params, merge, resolve_max_tokens, sse,
    submit_all, usage,
)
from hwinfer.server.logprobs import chat_logprobs, completion_logprobs
from hwinfer.server.protocol import ChatCompletionRequest, CompletionRequest, ServerError
from hwinfer.server.state import ServerState

router = APIRouter()


def _state(http: Request) -> ServerState:
    state: ServerState = http.app.state.server
    state.require_ready()
    return state


def _completion_prompts(state: ServerState, body: CompletionRequest) -> list[list[int]]:
    p = body.prompt
    if isinstance(p, str):
        prompts: list[Any] = [p]
    elif p and all(isinstance(t, int) for t in p):
        prompts = [p]
    else:
        prompts = list(p)
    if not prompts:
        raise ServerError(400, "prompt must not be empty", param="prompt")
    ids = [state.model.tokenizer.encode(x) if isinstance(x, str) else list(x) for x in prompts]
    if any(not x for x in ids):
        raise ServerError(400, "prompt must not be empty", param="prompt")
    return ids


@router.post("/v1/completions")
async def completions(body: CompletionRequest, http: Request):
    state = _state(http)
    state.check_model(body.model)
    body.check()
    prompts = _completion_prompts(state, body)
    stop = body.stop_list()
    jobs = []
    for ids in prompts:
        max_tokens = resolve_max_tokens(state, len(ids), body.max_tokens, "prompt")
        jobs += [(ids, make_params(max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                   seed=body.seed, stop=stop, ignore_eos=body.ignore_eos, choice=j,
                                   logprobs=body.logprobs))
                 for j in range(body.n)]
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    streams = await submit_all(state, jobs, rid)
    head = {"id": rid, "object": "text_completion", "created": created, "model": state.model_name}
    prompt_lens = [len(ids) for ids in prompts]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(i: int, text: str, reason: str | None, lps: list | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": i, "text": text, "finish_reason": reason,
                                         "logprobs": None if lps is None else completion_logprobs(lps)}]}
        return _stream(state, streams, chunk, None, head, prompt_lens, include_usage)
    final = await collect(state, streams, http)
    choices = [{"index": i, "text": d.text, "finish_reason": finish_reason(d.finish_reason),
                "logprobs": None if d.logprobs is None else completion_logprobs(d.logprobs)}
               for i, d in enumerate(final)]
    return JSONResponse({**head, "choices": choices, "usage": usage(final, prompt_lens)})


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, http: Request):
    state = _state(http)
    state.check_model(body.model)
    body.check()
    ids = chat_prompt_ids(state, body.chat(), "messages")
    max_tokens = resolve_max_tokens(state, len(ids), body.limit(), "messages")
    jobs = [(ids, make_params(max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                              seed=body.seed, stop=body.stop_list(), ignore_eos=body.ignore_eos, choice=j,
                              logprobs=body.num_logprobs()))
            for j in range(body.n)]
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    streams = await submit_all(state, jobs, rid)
    head = {"id": rid, "object": "chat.completion", "created": created, "model": state.model_name}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        head = {**head, "object": "chat.completion.chunk"}

        def chunk(i: int, text: str, reason: str | None, lps: list | None = None) -> dict[str, Any]:
            delta = {"content": text} if text or reason is None else {}
            return {**head, "choices": [{"index": i, "delta": delta, "finish_reason": reason,
                                         "logprobs": None if lps is None else chat_logprobs(lps)}]}

        def first(i: int) -> dict[str, Any]:
            return {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
        return _stream(state, streams, chunk, first, head, [len(ids)], include_usage)
    final = await collect(state, streams, http)
    choices = [{"index": i, "message": {"role": "assistant", "content": d.text},
                "logprobs": None if d.logprobs is None else chat_logprobs(d.logprobs),
                "finish_reason": finish_reason(d.finish_reason)} for i, d in enumerate(final)]
    return JSONResponse({**head, "choices": choices, "usage": usage(final, [len(ids)])})


def _stream(state: ServerState, streams: list[Stream], chunk, first, head: dict[str, Any],
            prompt_lens: list[int], include_usage: bool) -> StreamingResponse:
    """SSE: an optional opening chunk per choice, text chunks, a finishing chunk per choice, the
    usage chunk when asked for, then ``[DONE]``. A disconnect aborts every unfinished choice."""

    async def events() -> AsyncIterator[bytes]:
        final = []
        extra = {"usage": None} if include_usage else {}
        try:
            if first is not None:
                for i in range(len(streams)):
                    yield sse({**first(i), **extra})
            async for i, msg in merge(streams):
                if isinstance(msg, EngineFailure):
                    yield sse(ServerError(500, msg.message, type="server_error").body())
                    abort_unfinished(state, streams)
                    break
                if msg.text or msg.logprobs:
                    yield sse({**chunk(i, msg.text, None, msg.logprobs), **extra})
                if msg.finish_reason is not None:
                    final.append(msg)
                    yield sse({**chunk(i, "", finish_reason(msg.finish_reason)), **extra})
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage(final, prompt_lens)})
            yield sse("[DONE]")
        finally:
            abort_unfinished(state, streams)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
