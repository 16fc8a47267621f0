"""``hwinfer generate`` and ``hwinfer chat``: stream a model's text to the terminal."""
from __future__ import annotations

import sys
from typing import Callable, TextIO

from hwinfer.engine.engine import CPU_CACHE_BYTES, Engine
from hwinfer.engine.request import SamplingParams


def _open(path: str | None, device: str, kv_format: str = "auto"):
    from hwinfer.api import load_model
    from hwinfer.server.default_model import default_checkpoint

    model = load_model(path or default_checkpoint(), device=device, kv_format=kv_format)
    if model.tokenizer is None:
        raise ValueError("this checkpoint has no tokenizer.json")
    cache = CPU_CACHE_BYTES if model.device.type == "cpu" else None
    return model, Engine(model, max_num_seqs=1, cache_bytes=cache)


def stream_text(engine: Engine, prompt_ids: list[int], params: SamplingParams,
                write: Callable[[str], None]) -> tuple[str, str]:
    """Run one request, calling ``write`` with each new piece of text; returns (text, finish reason)."""
    req = engine.add_request(prompt_ids, params)
    sent = ""
    while engine.has_unfinished():
        engine.step()
        text = engine.output(req).text if req.finish_reason else engine.model.tokenizer.decode(req.output_ids)
        if not req.finish_reason:
            # Hold back an incomplete UTF-8 character and a possible stop-string prefix.
            hold = max((len(s) for s in params.stop), default=1) - 1
            if text.endswith("\ufffd"):
                continue
            text = text[:len(text) - hold] if hold else text
        if text.startswith(sent) and len(text) > len(sent):
            write(text[len(sent):])
            sent = text
    engine.requests.pop(req.id, None)
    return sent, req.finish_reason or "abort"


def generate_main(path: str | None, prompt: str, device: str, max_tokens: int, temperature: float | None,
                  seed: int | None, out: TextIO | None = None, kv_format: str = "auto") -> int:
    out = out or sys.stdout
    model, engine = _open(path, device, kv_format)
    ids = model.tokenizer.encode(prompt)

    def write(piece: str) -> None:
        out.write(piece)
        out.flush()
    _, reason = stream_text(engine, ids, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
                            write)
    out.write("\n")
    print(f"[{reason}]", file=sys.stderr)
    return 0


def chat_main(path: str | None, device: str, max_tokens: int, temperature: float | None, system: str | None,
              inp: TextIO | None = None, out: TextIO | None = None, kv_format: str = "auto") -> int:
    """An interactive chat: one user turn per line of input, until end of input or /exit."""
    inp, out = inp or sys.stdin, out or sys.stdout
    model, engine = _open(path, device, kv_format)
    messages = [{"role": "system", "content": system}] if system else []
    interactive = inp.isatty()
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = inp.readline()
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = model.tokenizer.encode(text, add_special_tokens=False)

        def write(piece: str) -> None:
            out.write(piece)
            out.flush()
        reply, _ = stream_text(engine, ids, SamplingParams(max_tokens=max_tokens, temperature=temperature), write)
        out.write("\n")
        out.flush()
        messages.append({"role": "assistant", "content": reply})
