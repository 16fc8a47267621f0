"""The FastAPI application: OpenAI-compatible routes over one EngineHandle.

``create_app(config)`` returns an app whose lifespan loads the model on a background thread
(``/health`` answers 503 until it is ready) and stops the engine thread on shutdown. Every error
leaves in the OpenAI format ``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from hwinfer.server.middleware import GuardMiddleware
from hwinfer.server.protocol import DetokenizeRequest, ServerError, TokenizeRequest
from hwinfer.server.state import ServerConfig, ServerState


def create_app(config: ServerConfig | None = None, *, load_in_background: bool = True) -> FastAPI:
    """The app for ``config``; with ``load_in_background=False`` the model loads before the app
    starts answering (tests)."""
    config = config or ServerConfig()
    state = ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = asyncio.get_running_loop().run_in_executor(None, state.load)
        if not load_in_background:
            await loader
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await loader
            state.shutdown()

    app = FastAPI(title="hwinfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
    _install_error_handlers(app)

    from hwinfer.server.routes_openai import router as openai_router
    from hwinfer.server.routes_responses import router as responses_router

    app.include_router(openai_router)
    app.include_router(responses_router)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        endpoint = getattr(route, "path", "unknown")
        state.metrics.http_requests.labels(endpoint, str(response.status_code)).inc()
        return response

    @app.get("/health")
    async def health() -> Response:
        state.require_ready()
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        state.require_ready()
        return JSONResponse({"object": "list", "data": [_model_card(state)]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> JSONResponse:
        state.require_ready()
        state.check_model(name)
        return JSONResponse(_model_card(state))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        state.require_ready()
        state.check_model(body.model)
        tok = state.model.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise ServerError(400, "give exactly one of 'prompt' and 'messages'", param="prompt")
        if body.messages is not None:
            text = tok.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages],
                                           add_generation_prompt=body.add_generation_prompt)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        state.require_ready()
        state.check_model(body.model)
        vocab = state.model.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ServerError(400, f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": state.model.tokenizer.decode(body.tokens)})

    return app


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "hwinfer",
            "max_model_len": state.max_model_len}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServerError)
    async def server_error(request: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            err = ServerError(400, f"malformed JSON body: {first.get('msg', '')}", code="invalid_json")
        else:
            loc = [str(p) for p in first.get("loc", ()) if p != "body"]
            err = ServerError(400, "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: "
                                             f"{e.get('msg')}" for e in errors) or "invalid request",
                              param=".".join(loc) or None, code="invalid_value")
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = ServerError(exc.status_code, str(exc.detail), type=kind)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        err = ServerError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(err.body(), status_code=500)


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the server until interrupted (``hwinfer serve``)."""
    import uvicorn

    start = time.perf_counter()
    app = create_app(config)
    print(f"hwinfer: serving on http://{host}:{port}/v1 (model loads in the background; "
          f"/health turns 200 when ready) [{time.perf_counter() - start:.1f}s]", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
