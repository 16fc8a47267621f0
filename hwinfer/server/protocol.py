"""Request bodies of the OpenAI-compatible endpoints (pydantic), and the OpenAI error format.

Only the fields hwinfer acts on are declared; unknown fields are ignored, as OpenAI-compatible
servers commonly do. Fields hwinfer declares but cannot honour (penalties, echo, ...) are
rejected with a clear 400 by :func:`unsupported` rather than silently ignored.
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class ServerError(Exception):
    """An error answered in the OpenAI format: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    ignore_eos: bool = False
    user: str | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise ServerError(400, "at most 4 stop sequences are allowed", param="stop")
        if any(not s for s in stops):
            raise ServerError(400, "stop sequences must not be empty", param="stop")
        return stops

    def check_common(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                unsupported(name)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = None

    def check(self) -> None:
        self.check_common()
        if self.echo:
            unsupported("echo")
        if self.suffix:
            unsupported("suffix")
        if self.best_of not in (None, 1, self.n):
            unsupported("best_of")


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; content parts other than text are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text":
                raise ServerError(400, f"content part type {part.type!r} is not supported (text only)",
                                  param="messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.top_logprobs is not None and not self.logprobs:
            raise ServerError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        if self.tools:
            unsupported("tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            unsupported("response_format")

    def num_logprobs(self) -> int | None:
        """Top alternatives per token for the engine (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class ResponseInputMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[dict[str, Any]]]
    type: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") not in ("input_text", "output_text", "text"):
                raise ServerError(400, f"input part type {part.get('type')!r} is not supported (text only)",
                                  param="input")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ResponsesRequest(_Body):
    model: str
    input: Union[str, list[ResponseInputMessage]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None

    def check(self) -> None:
        if self.tools:
            unsupported("tools")
        if self.previous_response_id:
            unsupported("previous_response_id")

    def chat(self) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return messages + [{"role": "user", "content": self.input}]
        return messages + [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                           for m in self.input]


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def unsupported(param: str) -> None:
    """Refuse a parameter hwinfer does not implement (a 400 naming it)."""
    raise ServerError(400, f"{param!r} is not supported by this server", param=param, code="unsupported_parameter")
