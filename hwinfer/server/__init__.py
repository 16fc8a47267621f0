"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) over an async engine handle.

``create_app(ServerConfig(...))`` builds the app; ``serve(config, host, port)`` runs it;
``hwinfer serve [PATH]`` is the command line. See docs in the module files:
engine_handle.py (the engine thread and its messages), protocol.py (request bodies, errors),
routes_openai.py / routes_responses.py (the endpoints), metrics.py (Prometheus).
"""
__all__ = ["ServerConfig", "create_app", "serve"]


def __getattr__(name: str):
    # The web stack (pydantic, FastAPI) is imported only when the server is asked for, so that
    # `hwinfer generate` / `chat`, which read default_model.py from this package, run without it.
    if name == "ServerConfig":
        from hwinfer.server.state import ServerConfig

        return ServerConfig
    if name in ("create_app", "serve"):
        from hwinfer.server import app

        return getattr(app, name)
    raise AttributeError(name)
