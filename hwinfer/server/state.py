"""Server configuration and the loaded state (model, engine handle, metrics)."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwinfer.engine.engine import CPU_CACHE_BYTES
from hwinfer.server.protocol import ServerError

log = logging.getLogger("hwinfer.server")


@dataclass
class ServerConfig:
    """What ``hwinfer serve`` was asked for. ``model_path=None`` serves the embedded default."""

    model_path: str | None = None
    device: str = "auto"
    dtype: str | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    cache_bytes: int | None = None
    enable_prefix_caching: bool = False
    tensor_parallel: int = 1
    expert_parallel: int = 1
    kv_format: str = "auto"  # cache storage, see hwinfer.models.base.CausalLM.set_kv_format
    max_body_bytes: int = 8 << 20
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


class ServerState:
    """Loads the model on a background thread; ``ready`` once the engine runs."""

    def __init__(self, config: ServerConfig) -> None:
        from hwinfer.server.metrics import Metrics

        self.config = config
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.model = None
        self.handle = None
        self.model_name = config.served_model_name or _name_of(config.model_path)
        self.max_model_len = 0
        self.created = 0

    def load(self) -> None:
        """Load the checkpoint and start the engine thread (blocking; call from a thread)."""
        import time

        from hwinfer.api import load_model
        from hwinfer.engine.engine import Engine
        from hwinfer.server.default_model import default_checkpoint
        from hwinfer.server.engine_handle import EngineHandle

        try:
            path = Path(self.config.model_path) if self.config.model_path else default_checkpoint()
            self.model = load_model(path, device=self.config.device, dtype=self.config.dtype,
                                    tensor_parallel=self.config.tensor_parallel,
                                    expert_parallel=self.config.expert_parallel,
                                    kv_format=self.config.kv_format)
            if self.model.tokenizer is None:
                raise ValueError(f"{path}: no tokenizer.json; the server needs a tokenizer")
            cache_bytes = self.config.cache_bytes
            if cache_bytes is None and self.model.device.type == "cpu":
                # The engine's step time grows with the pool's size on the CPU: keep it modest.
                cache_bytes = CPU_CACHE_BYTES
            engine = Engine(self.model, max_num_seqs=self.config.max_num_seqs,
                            max_num_batched_tokens=self.config.max_num_batched_tokens,
                            cache_bytes=cache_bytes,
                            enable_prefix_caching=self.config.enable_prefix_caching, **self.config.engine_kwargs)
            limit = self.model.config.get("max_position_embeddings") or 1 << 30
            pool_tokens = engine.pool.num_blocks * engine.pool.block_size
            self.max_model_len = min(limit, pool_tokens, self.config.max_model_len or limit)
            self.metrics.bind(engine)
            self.handle = EngineHandle(engine, observer=self.metrics.observe)
            self.created = int(time.time())
            log.info("serving %s from %s (context %d tokens)", self.model_name, path, self.max_model_len)
            self.ready.set()
        except Exception as exc:
            log.exception("loading the model failed")
            self.load_error = f"{type(exc).__name__}: {exc}"

    def require_ready(self) -> None:
        if self.load_error:
            raise ServerError(503, f"model failed to load: {self.load_error}", type="server_error")
        if not self.ready.is_set():
            raise ServerError(503, "the model is still loading", type="server_error", code="model_loading")

    def check_model(self, name: str | None) -> None:
        """404 unless ``name`` is the served model (None: any)."""
        if name is not None and name != self.model_name:
            raise ServerError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                              param="model", code="model_not_found")

    def shutdown(self) -> None:
        if self.handle is not None:
            self.handle.shutdown()
        close = getattr(self.model, "close", None)  # a tensor-parallel model: stop the other ranks
        if close is not None:
            close()


def _name_of(path: str | None) -> str:
    from hwinfer.server.default_model import DEFAULT_MODEL_NAME

    if not path:
        return DEFAULT_MODEL_NAME
    return Path(path).resolve().name or str(path)
