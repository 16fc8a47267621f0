"""Tokenizer: tokenizer.json through the `tokenizers` library, plus the chat template.

tokenizer_config.json supplies the chat template (a Jinja template rendered in a sandbox), the
special tokens and whether a BOS token is prepended; chat_template.jinja, where present, wins
(newer checkpoints keep the template there).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hwinfer.loader.config import ConfigError


class Tokenizer:
    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        root = Path(path)
        file = root / "tokenizer.json"
        if not file.exists():
            raise ConfigError(f"{root}: tokenizer.json not found")
        try:
            self._tok = HFTokenizer.from_file(str(file))
        except Exception as exc:
            raise ConfigError(f"{file}: cannot be read by the tokenizers library ({exc})") from None
        cfg_path = root / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template_file = root / "chat_template.jinja"
        self.chat_template: str | None = (template_file.read_text() if template_file.exists()
                                          else self.config.get("chat_template"))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.add_bos = bool(self.config.get("add_bos_token", False)) and self.bos_token is not None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos:
            bos = self.token_id(self.bos_token)
            if bos is not None and (not ids or ids[0] != bos):
                ids = [bos] + ids
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a byte-level BPE token may be part of a UTF-8
        character, which ``decode`` alone shows as U+FFFD)."""
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if type(self._tok.decoder).__name__ == "ByteLevel":
            table = _byte_level_table()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return self._tok.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render ``messages`` with the checkpoint's chat template (sandboxed Jinja)."""
        if not self.chat_template:
            raise ConfigError("this checkpoint has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)


_BYTE_TABLE: dict[str, int] = {}


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte, inverted (char -> byte):
    printable Latin-1 bytes stand for themselves, the rest map to U+0100 onwards in order."""
    if not _BYTE_TABLE:
        keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
        extra = 0
        for b in range(256):
            if b in keep:
                _BYTE_TABLE[chr(b)] = b
            else:
                _BYTE_TABLE[chr(256 + extra)] = b
                extra += 1
    return _BYTE_TABLE


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value
