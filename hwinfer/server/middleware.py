"""ASGI middleware: request-body size limit (413) and the API key (401), answered in the OpenAI
error format before any route runs."""
from __future__ import annotations

import hmac
import json

from hwinfer.server.protocol import ServerError

# Paths anyone may read: liveness and metrics scrapers carry no key.
OPEN_PATHS = ("/health", "/metrics")


async def send_error(send, err: ServerError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Checks ``Authorization: Bearer <key>`` (when a key is set) and buffers the request body up
    to ``max_body_bytes``, refusing larger bodies with 413. Later ``receive`` calls go to the
    server, so disconnects are still seen."""

    def __init__(self, app, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and not scope["path"].startswith(OPEN_PATHS):
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                msg = "missing API key" if not auth else "incorrect API key provided"
                return await send_error(send, ServerError(401, msg, type="authentication_error",
                                                          code="invalid_api_key"),
                                        [(b"www-authenticate", b"Bearer")])
        too_big = ServerError(413, f"request body larger than {self.max_body_bytes} bytes",
                              code="request_too_large")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await send_error(send, too_big)
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                return await send_error(send, too_big)
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)
