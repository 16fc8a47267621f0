"""/v1/responses: text in, text out, streaming or not (no tools, no stored conversations)."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from hwinfer.server.engine_handle import EngineFailure
from hwinfer.server.generation import (
    abort_unfinished, chat_prompt_ids, collect, make_params, merge, resolve_max_tokens, sse, submit_all,
)
from hwinfer.server.protocol import ResponsesRequest
from hwinfer.server.routes_openai import _state

router = APIRouter()


def _response(rid: str, msg_id: str, created: int, body: ResponsesRequest, model: str, status: str,
              text: str | None, usage: dict[str, Any] | None, reason: str | None = None) -> dict[str, Any]:
    output = []
    if text is not None:
        output = [{"type": "message", "id": msg_id, "status": "completed" if status != "in_progress" else status,
                   "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}]
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "parallel_tool_calls": False,
            "tool_choice": "none", "tools": [], "usage": usage}


def _usage(prompt: int, output: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + output}


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, http: Request):
    state = _state(http)
    state.check_model(body.model)
    body.check()
    ids = chat_prompt_ids(state, body.chat(), "input")
    max_tokens = resolve_max_tokens(state, len(ids), body.max_output_tokens, "input")
    params = make_params(max_tokens, temperature=body.temperature, top_p=body.top_p, seed=None, stop=[])
    rid, msg_id, created = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())
    streams = await submit_all(state, [(ids, params)], rid)
    if not body.stream:
        (final,) = await collect(state, streams, http)
        status = "incomplete" if final.finish_reason == "length" else "completed"
        return JSONResponse(_response(rid, msg_id, created, body, state.model_name, status, final.text,
                                      _usage(final.num_prompt_tokens, final.num_output_tokens), final.finish_reason))

    async def events() -> AsyncIterator[bytes]:
        seq = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            seq += 1
            return sse({"type": kind, "sequence_number": seq - 1, **fields})
        item = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
        try:
            start = _response(rid, msg_id, created, body, state.model_name, "in_progress", None, None)
            yield event("response.created", response=start)
            yield event("response.in_progress", response=start)
            yield event("response.output_item.added", output_index=0, item=item)
            yield event("response.content_part.added", part=part, **where)
            text = ""
            async for _, msg in merge(streams):
                if isinstance(msg, EngineFailure):
                    failed = _response(rid, msg_id, created, body, state.model_name, "failed", text, None)
                    failed["error"] = {"code": "server_error", "message": msg.message}
                    yield event("response.failed", response=failed)
                    return
                if msg.text:
                    text += msg.text
                    yield event("response.output_text.delta", delta=msg.text, logprobs=[], **where)
                if msg.finish_reason is not None:
                    done_part = {**part, "text": text}
                    yield event("response.output_text.done", text=text, logprobs=[], **where)
                    yield event("response.content_part.done", part=done_part, **where)
                    yield event("response.output_item.done", output_index=0,
                                item={**item, "status": "completed", "content": [done_part]})
                    status = "incomplete" if msg.finish_reason == "length" else "completed"
                    final = _response(rid, msg_id, created, body, state.model_name, status, text,
                                      _usage(msg.num_prompt_tokens, msg.num_output_tokens), msg.finish_reason)
                    yield event(f"response.{status}", response=final)
        finally:
            abort_unfinished(state, streams)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
