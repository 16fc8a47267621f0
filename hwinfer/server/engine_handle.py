"""The async engine handle: one thread owns the Engine; coroutines talk to it through messages.

Coroutines call :meth:`EngineHandle.submit` (returns a :class:`Stream` once the engine accepted
the request, or raises its ValueError) and :meth:`EngineHandle.abort`. Commands travel to the
engine thread over a thread-safe queue; the thread steps the engine and sends each request's
new text back to its stream's asyncio queue as :class:`Delta` messages, ending with
``finish_reason`` set (or an :class:`EngineFailure`). The Engine itself is never touched
outside its thread.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from hwinfer.engine.engine import Engine
from hwinfer.engine.request import Request, SamplingParams
from hwinfer.server.logprobs import TokenInfo, describe

log = logging.getLogger("hwinfer.server")


@dataclass
class Delta:
    """New text of one request since the last message; ``finish_reason`` set on the last one."""

    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None
    logprobs: list[TokenInfo] | None = None  # tokens new since the last message (when asked)


@dataclass
class EngineFailure:
    """The engine raised while stepping; every request in flight ends with this."""

    message: str


@dataclass
class _Submit:
    prompt_ids: list[int]
    params: SamplingParams
    stream: "Stream"
    accepted: Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class Stream:
    """One request's view from the event loop: its id and the messages the engine sends it."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: bool = False

    async def next(self) -> Delta | EngineFailure:
        return await self.messages.get()


@dataclass
class _Tracked:
    """Engine-thread bookkeeping for one request: how much of its text was sent."""

    req: Request
    stream: Stream
    sent: str = ""
    hold: int = 0
    logprobs_sent: int = 0


class EngineHandle:
    """Owns an Engine on a background thread. ``observer(stream, delta)`` (optional) is called
    in the engine thread for every message, for metrics."""

    def __init__(self, engine: Engine, observer=None) -> None:
        self.engine = engine
        self.tokenizer = engine.model.tokenizer
        self.observer = observer
        self._commands: queue.Queue = queue.Queue()
        self._tracked: dict[str, _Tracked] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hwinfer-engine", daemon=True)
        self._thread.start()

    # --- the event-loop side -------------------------------------------------------------------
    async def submit(self, prompt_ids: list[int], params: SamplingParams, prefix: str = "req") -> Stream:
        """Queue a request; returns its Stream once the engine accepted it (ValueError if not)."""
        loop = asyncio.get_running_loop()
        stream = Stream(f"{prefix}-{next(self._ids)}", loop)
        accepted: Future = Future()
        self._commands.put(_Submit(list(prompt_ids), params, stream, accepted))
        await asyncio.wrap_future(accepted)
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request (a client went away); its cache returns to the pool."""
        self._commands.put(_Abort(request_id))

    def shutdown(self) -> None:
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout=10)

    @property
    def num_in_flight(self) -> int:
        return len(self._tracked)

    def run_sync(self, fn):
        """Run ``fn(engine)`` on the engine thread and wait for its result (tests, admin)."""
        done: Future = Future()
        self._commands.put((fn, done))
        return done.result(timeout=60)

    # --- the engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            if not self.engine.has_unfinished():
                try:
                    self._take(self._commands.get(timeout=0.5))
                except queue.Empty:
                    continue
            while True:
                try:
                    self._take(self._commands.get_nowait())
                except queue.Empty:
                    break
            if self.engine.has_unfinished():
                try:
                    self.engine.step()
                except Exception as exc:  # an engine failure must not hang every client
                    log.exception("engine step failed")
                    self._fail_all(f"engine error: {exc}")
                    continue
                self._emit()

    def _take(self, cmd) -> None:
        if cmd is None:
            return
        if isinstance(cmd, _Submit):
            try:
                req = self.engine.add_request(cmd.prompt_ids, cmd.params, request_id=cmd.stream.request_id)
            except ValueError as exc:
                cmd.accepted.set_exception(exc)
                return
            hold = max((len(s) for s in cmd.params.stop), default=1) - 1
            self._tracked[req.id] = _Tracked(req, cmd.stream, hold=hold)
            cmd.accepted.set_result(None)
        elif isinstance(cmd, _Abort):
            tracked = self._tracked.pop(cmd.request_id, None)
            if tracked is not None:
                self.engine.abort(cmd.request_id)
                self.engine.requests.pop(cmd.request_id, None)
                self._send(tracked, Delta("", len(tracked.req.prompt_ids), len(tracked.req.output_ids), "abort"))
        elif isinstance(cmd, tuple):
            fn, done = cmd
            try:
                done.set_result(fn(self.engine))
            except Exception as exc:
                done.set_exception(exc)

    def _emit(self) -> None:
        for rid, tracked in list(self._tracked.items()):
            req = tracked.req
            finished = req.finish_reason is not None
            if not finished and len(req.output_ids) == 0:
                continue
            text = self._text(tracked, finished)
            if text is None:
                continue
            delta = text[len(tracked.sent):] if text.startswith(tracked.sent) else ""
            tracked.sent = text if len(text) > len(tracked.sent) else tracked.sent
            if delta or finished:
                self._send(tracked, Delta(delta, len(req.prompt_ids), len(req.output_ids),
                                          req.finish_reason if finished else None,
                                          self._logprobs(tracked, finished)))
            if finished:
                del self._tracked[rid]
                self.engine.requests.pop(rid, None)

    def _logprobs(self, tracked: _Tracked, finished: bool) -> list[TokenInfo] | None:
        """Logprobs of the tokens generated since the last message (a final EOS excluded, as
        from the text), or None when the request did not ask for them."""
        req = tracked.req
        if req.params.logprobs is None or self.tokenizer is None:
            return None
        end = len(req.output_ids)
        if finished and req.finish_reason == "stop" and end and \
                req.output_ids[-1] in self.engine.model.generation_defaults.eos_token_ids:
            end -= 1
        start = tracked.logprobs_sent
        tracked.logprobs_sent = max(start, end)
        return describe(self.tokenizer, req.output_ids, req.logprobs[start:end], start)

    def _text(self, tracked: _Tracked, finished: bool) -> str | None:
        """The text safe to send now: stop strings cut, and (until the end) the tail that could
        still become a stop string or an incomplete UTF-8 character held back."""
        req = tracked.req
        if self.tokenizer is None:
            return ""
        tokens = list(req.output_ids)
        eos = self.engine.model.generation_defaults.eos_token_ids
        if finished and req.finish_reason == "stop" and tokens and tokens[-1] in eos:
            tokens = tokens[:-1]
        text = self.tokenizer.decode(tokens)
        for s in req.params.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        if finished:
            return text
        if text.endswith("\ufffd"):
            return None
        return text[:len(text) - tracked.hold] if tracked.hold else text

    def _send(self, tracked: _Tracked, msg: Delta | EngineFailure) -> None:
        stream = tracked.stream
        if self.observer is not None:
            try:
                self.observer(stream, msg)
            except Exception:
                log.exception("metrics observer failed")
        try:
            stream.loop.call_soon_threadsafe(stream.messages.put_nowait, msg)
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass

    def _fail_all(self, message: str) -> None:
        for rid, tracked in list(self._tracked.items()):
            self.engine.abort(rid)
            self.engine.requests.pop(rid, None)
            self._send(tracked, EngineFailure(message))
        self._tracked.clear()
