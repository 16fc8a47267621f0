"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) over an async engine handle.

``create_app(ServerConfig(...))`` builds the app; ``serve(config, host, port)`` runs it;
``hwinfer serve [PATH]`` is the command line. See docs in the module files:
engine_handle.py (the engine thread and its messages), protocol.py (request bodies, errors),
routes_openai.py / routes_responses.py (the endpoints), metrics.py (Prometheus).
"""
from hwinfer.server.state import ServerConfig

__all__ = ["ServerConfig", "create_app", "serve"]


def __getattr__(name: str):
    # FastAPI is an optional extra: import it only when the app is asked for.
    if name in ("create_app", "serve"):
        from hwinfer.server import app

        return getattr(app, name)
    raise AttributeError(name)
