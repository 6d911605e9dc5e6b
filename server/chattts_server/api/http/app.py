"""The FastAPI app of the HTTP front door: routes, bearer tokens, errors as OpenAI objects.

Routes: `POST /v1/audio/speech` (api/http/speech.py), `WS /v1/audio/speech/stream`
(api/http/websocket.py), `GET /v1/models`, `GET /v1/audio/voices`, `GET /health` (open, for
load balancers: 200 while serving, 503 while loading or draining), `GET /` (the playground,
open: one static file; its requests carry the token you type into it) and `GET /openapi.json`.
The two speech routes take the one way in (`Synthesis.accept`: token, accepting, parsing,
refusal accounting), as gRPC does.

On a server with tokens, `/openapi.json` needs the token like `/v1/models` (API tools send the
header), and `/docs` (Swagger UI) is off: a browser page cannot add the header to its own fetch
of the schema, and the schema is the same on every server (docs/api.md). Without tokens both are
open.

FastAPI on uvicorn because it is what the OpenAI-compatible servers our users compare us with
run (vLLM, Kokoro-FastAPI, ChatTTS-Forge), it speaks HTTP/1.1, chunked streaming, SSE and
WebSockets in one ASGI app, and uvicorn runs as a plain coroutine in the loop grpc.aio already
owns: one process, one engine, one admission.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import resources

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, JSONResponse, Response

from ...config import LimitsConfig
from ..auth import AuthError
from ..synthesis import Synthesis
from .errors import error_body, failure, http_failure
from .openai_fields import OPENAI_VOICE_SEEDS
from .speech import error_response, speech_route
from .websocket import speech_stream

MODEL_ID = "chattts"
_CREATED = int(time.time())


def build_app(synthesis: Synthesis, serving: Callable[[], bool], limits: LimitsConfig) -> FastAPI:
    """`serving()` says whether the server takes work (for /health)."""
    tokens_on = synthesis.tokens is not None
    app = FastAPI(
        title="chattts-stream HTTP",
        summary="OpenAI-compatible streaming speech, a streaming WebSocket and a playground",
        docs_url=None if tokens_on else "/docs",
        openapi_url=None if tokens_on else "/openapi.json",  # with tokens: served below
        redoc_url=None,
    )
    _add_error_handlers(app)
    _add_info_routes(app, synthesis, serving)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        return await speech_route(request, synthesis, limits.max_body_bytes)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_ws(ws: WebSocket) -> None:
        await speech_stream(ws, synthesis)

    return app


def _denied(synthesis: Synthesis, request: Request) -> Response | None:
    """The 401 answer when the request's bearer token is refused, else None."""
    try:
        synthesis.check_token(request.headers.get("authorization"), request.url.path)
    except AuthError as exc:
        return error_response(http_failure(exc))
    return None


def _add_error_handlers(app: FastAPI) -> None:
    """Starlette's and FastAPI's own errors in the same JSON body as ours."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        status = {404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}.get(exc.status_code, "UNKNOWN")
        body = error_body(str(exc.detail), "invalid_request_error", None, status.lower())
        # exc.headers carries Allow on a 405 (RFC 9110 requires it).
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(failure("INVALID_ARGUMENT", str(first.get("msg", exc)), param))


def _add_info_routes(app: FastAPI, synthesis: Synthesis, serving: Callable[[], bool]) -> None:
    """The playground, /health, the OpenAPI schema behind a token, models and voices."""
    playground = resources.files("chattts_server.api.http").joinpath("playground.html")

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return HTMLResponse(playground.read_text(encoding="utf-8"))

    if synthesis.tokens is not None:

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(request: Request) -> Response:
            return _denied(synthesis, request) or JSONResponse(app.openapi())

    @app.get("/health")
    async def health() -> Response:
        if serving():
            return JSONResponse({"status": "SERVING"})
        return JSONResponse({"status": "NOT_SERVING"}, status_code=503)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        model = {
            "id": MODEL_ID,
            "object": "model",
            "created": _CREATED,
            "owned_by": "chattts-stream",
        }
        return _denied(synthesis, request) or JSONResponse({"object": "list", "data": [model]})

    @app.get("/v1/audio/voices")
    async def voices(request: Request) -> Response:
        presets = [
            {"id": p.name, "name": p.name, "description": p.description}
            for p in synthesis.voices.list()
        ]
        aliases = [
            {"id": name, "name": name, "description": f"ChatTTS speaker seed {seed}"}
            for name, seed in OPENAI_VOICE_SEEDS.items()
            if synthesis.voices.get(name) is None
        ]
        body = {"object": "list", "data": presets + aliases}
        return _denied(synthesis, request) or JSONResponse(body)
