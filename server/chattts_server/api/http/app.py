"""The FastAPI app of the HTTP front door: routes, bearer tokens, errors as OpenAI objects.

Routes: `POST /v1/audio/speech` (api/http/speech.py), `WS /v1/audio/speech/stream`
(api/http/websocket.py), `GET /v1/models`, `GET /v1/audio/voices`, `GET /health` (open, for
load balancers: 200 while serving, 503 while loading or draining) and `GET /` (the playground,
open: one static file; its requests carry the token you type into it).

FastAPI on uvicorn because it is what the OpenAI-compatible servers our users compare us with
run (vLLM, Kokoro-FastAPI, ChatTTS-Forge), it speaks HTTP/1.1, chunked streaming, SSE and
WebSockets in one ASGI app, and uvicorn runs as a plain coroutine in the loop grpc.aio already
owns: one process, one engine, one admission.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..convert import FieldError
from ..errors import is_ours
from ..synthesis import Synthesis
from .errors import HTTPFailure, error_body, failure, http_failure
from .openai_fields import OPENAI_VOICE_SEEDS
from .speech import METHOD, SpeechResponse, error_response, parse_speech_request
from .websocket import speech_stream

log = logging.getLogger(__name__)

MODEL_ID = "chattts"
_CREATED = int(time.time())


def check_token(tokens: tuple[bytes, ...] | None, header: str | None) -> HTTPFailure | None:
    """None if the bearer token in `header` is accepted (or auth is off), else the failure:
    401 without a token, 403 with a wrong one (as gRPC's UNAUTHENTICATED/PERMISSION_DENIED)."""
    if tokens is None:
        return None
    if not header:
        return failure("UNAUTHENTICATED", "missing bearer token")
    scheme, _, token = header.partition(" ")
    ok = False
    for candidate in tokens:  # every token, in constant time
        ok |= hmac.compare_digest(candidate, token.strip().encode())
    if scheme.lower() != "bearer" or not ok:
        log.warning("rejected an HTTP request with a wrong token")
        return failure("PERMISSION_DENIED", "invalid bearer token")
    return None


def build_app(synthesis: Synthesis, tokens: tuple[bytes, ...] | None, serving: Any) -> FastAPI:
    """`serving()` says whether the server takes work (for /health)."""
    app = FastAPI(
        title="chattts-stream HTTP",
        summary="OpenAI-compatible streaming speech, a streaming WebSocket and a playground",
        docs_url="/docs",
        redoc_url=None,
    )
    playground = resources.files("chattts_server.api.http").joinpath("playground.html")

    def authorized(request: Request) -> HTTPFailure | None:
        return check_token(tokens, request.headers.get("authorization"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        status = {404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}.get(exc.status_code, "UNKNOWN")
        body = error_body(str(exc.detail), "invalid_request_error", None, status.lower())
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(failure("INVALID_ARGUMENT", str(first.get("msg", exc)), param))

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return HTMLResponse(playground.read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> Response:
        if serving():
            return JSONResponse({"status": "SERVING"})
        return JSONResponse({"status": "NOT_SERVING"}, status_code=503)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        denied = authorized(request)
        if denied is not None:
            return error_response(denied)
        model = {
            "id": MODEL_ID,
            "object": "model",
            "created": _CREATED,
            "owned_by": "chattts-stream",
        }
        return JSONResponse({"object": "list", "data": [model]})

    @app.get("/v1/audio/voices")
    async def voices(request: Request) -> Response:
        denied = authorized(request)
        if denied is not None:
            return error_response(denied)
        presets = [
            {"id": p.name, "name": p.name, "description": p.description}
            for p in synthesis.voices.list()
        ]
        aliases = [
            {"id": name, "name": name, "description": f"ChatTTS speaker seed {seed}"}
            for name, seed in OPENAI_VOICE_SEEDS.items()
            if synthesis.voices.get(name) is None
        ]
        return JSONResponse({"object": "list", "data": presets + aliases})

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        denied = authorized(request)
        if denied is not None:
            synthesis.refused(METHOD, denied.status)
            return error_response(denied)
        try:
            synthesis.check_accepting()
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError:
                raise FieldError("body", "is not valid JSON") from None
            job = parse_speech_request(body, synthesis)
        except Exception as exc:
            if not is_ours(exc):
                raise
            synthesis.refused(METHOD, exc)
            return error_response(http_failure(exc, synthesis.admission_config.retry_pushback_ms))
        return SpeechResponse(synthesis, job)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_ws(ws: WebSocket) -> None:
        # Browsers cannot set headers on a WebSocket: they may pass ?api_key= instead.
        header = ws.headers.get("authorization")
        if header is None and "api_key" in ws.query_params:
            header = "Bearer " + ws.query_params["api_key"]
        await speech_stream(ws, synthesis, check_token(tokens, header))

    return app
