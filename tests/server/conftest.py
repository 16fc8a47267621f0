"""A real uvicorn server on 127.0.0.1 (a free port, in a thread) serving a tiny checkpoint, for the
whole module; the real ``openai`` client talks to it."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

import openai  # noqa: E402
import uvicorn  # noqa: E402

from hwinfer.server.app import create_app  # noqa: E402
from hwinfer.server.state import ServerConfig, ServerState  # noqa: E402
from hwinfer.testing.checkpoints import write_checkpoint  # noqa: E402

API_KEY = "test-key"
MAX_BODY = 64 << 10


@dataclass
class Running:
    url: str
    state: ServerState
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(config: ServerConfig, *, wait_ready: bool = True) -> Running:
    app = create_app(config, load_in_background=not wait_ready)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}", app.state.server, server, thread)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return write_checkpoint("qwen3_5", tmp_path_factory.mktemp("served") / "tiny-qwen")


@pytest.fixture(scope="session")
def server(checkpoint):
    running = start_server(ServerConfig(model_path=str(checkpoint), device="cpu", api_key=API_KEY,
                                        served_model_name="tiny", max_model_len=256, max_num_seqs=8,
                                        cache_bytes=16 << 20, max_body_bytes=MAX_BODY))
    assert running.state.ready.is_set(), running.state.load_error
    yield running
    running.stop()


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=30) as c:
        yield c


def engine_idle(server: Running, timeout: float = 20.0) -> bool:
    """Wait until no request is in flight; then: is the cache pool empty?"""
    deadline = time.monotonic() + timeout
    while server.state.handle.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.state.handle.run_sync(lambda engine: engine.pool.is_empty() and not engine.has_unfinished())
