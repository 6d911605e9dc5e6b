"""The gRPC server process: wiring, health, reflection, TLS/auth, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chattts_proto.chattts.v1 import tts_pb2

from .api.admission import Admission
from .api.auth import BearerTokenInterceptor
from .api.health import HealthServicer
from .api.servicer import TextToSpeechServicer, add_to_server
from .api.synthesis import Synthesis
from .api.voices import VoiceLibrary
from .config import ServerConfig
from .engine.engine import ChatTTSEngine
from .metrics import Metrics
from .startup import (
    StartupError,
    credentials,
    grpc_options,
    load_lexicons,
    load_server_tokens,
    reserve_port,
    warn_if_slots_too_short,
)

log = logging.getLogger(__name__)

SERVICE_NAME = tts_pb2.DESCRIPTOR.services_by_name["TextToSpeech"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class TTSServer:
    """Owns the engine, the grpc.aio server and the lifecycle between them."""

    def __init__(self, config: ServerConfig, engine: ChatTTSEngine | None = None) -> None:
        self.config = config
        self.engine = engine or ChatTTSEngine(config.model, config.engine)
        self.metrics = Metrics()
        self.voices = VoiceLibrary(config.voices_dir)
        self.admission: Admission | None = None
        self.health = HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._stopped: asyncio.Event | None = None
        self._fatal: BaseException | None = None
        self._draining = False
        self.synthesis: Synthesis | None = None
        self.servicer: TextToSpeechServicer | None = None
        self.http: Any = None
        """The HTTP front door (api/http/serve.HTTPServer) when --http-port is set."""
        self.http_port = 0
        self._reserved: list[socket.socket] = []
        """The ports --listen-when-ready holds until the model is ready."""
        self._credentials_for_port: grpc.ServerCredentials | None = None
        self._listening = False
        self._reload_lock = asyncio.Lock()
        self._reloads: set[asyncio.Future[None]] = set()
        """SIGHUP reloads under way (a reference keeps each task alive until it is done)."""

    async def start(self) -> int:
        """Bind and start serving (health NOT_SERVING); the engine loads in the background."""
        cfg = self.config
        warn_if_slots_too_short(cfg)
        self._stopped = asyncio.Event()
        self.admission = Admission(
            cfg.engine.max_streams, cfg.admission.max_queue, cfg.admission.reserved_slots
        )
        tokens = load_server_tokens(cfg)
        server_lexicons = load_lexicons(cfg)
        interceptors = [] if tokens is None else [BearerTokenInterceptor(tokens)]
        self._credentials_for_port = credentials(cfg.security)
        self.server = grpc.aio.server(options=grpc_options(cfg), interceptors=interceptors)
        # One way in, one admission: gRPC and HTTP share them.
        self.synthesis = Synthesis(
            self.engine,
            self.voices,
            self.admission,
            cfg.limits,
            cfg.admission,
            self.metrics,
            tokens,
            server_lexicons,
        )
        await self._add_services(self.server, self.synthesis)
        if cfg.network.listen_when_ready:
            self._reserve_ports()
        else:
            await self._listen(cfg.network.port, cfg.network.http_port)
        self._bind_metrics()
        self._start_engine()
        when = "once the model is ready" if cfg.network.listen_when_ready else "now"
        log.info("port %d (listening %s), loading the model", self.port, when)
        return self.port

    def _bind_metrics(self) -> None:
        """The gauges read the admission and the engine; --metrics-port serves them."""
        if self.config.network.metrics_port:
            self.metrics.serve(self.config.network.metrics_port)
        admission = self.admission
        assert admission is not None
        self.metrics.bind(
            active=lambda: admission.active,
            queued=lambda: admission.waiting,
            slots_in_use=lambda: self.engine.stats().active_requests,
            slots_total=lambda: self.engine.stats().num_slots,
        )

    def _start_engine(self) -> None:
        """Load the model on the engine's thread; its news comes back to this loop."""
        loop = asyncio.get_running_loop()

        def on_ready() -> None:
            loop.call_soon_threadsafe(self._on_engine_ready)

        def on_fatal(exc: BaseException) -> None:
            loop.call_soon_threadsafe(self._on_engine_fatal, exc)

        self.engine.start(on_ready=on_ready, on_fatal=on_fatal)

    async def _add_services(self, server: grpc.aio.Server, synthesis: Synthesis) -> None:
        """TextToSpeech, health (NOT_SERVING until the model is ready) and, unless turned off,
        reflection."""
        self.servicer = TextToSpeechServicer(synthesis)
        add_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        await self.health.set("", NOT_SERVING)
        await self.health.set(SERVICE_NAME, NOT_SERVING)
        if self.config.security.reflection:
            reflection.enable_server_reflection(
                (
                    SERVICE_NAME,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ),
                server,
            )

    def _reserve_ports(self) -> None:
        """--listen-when-ready: hold the ports bound but not listening (connections to them are
        refused, so even a TCP health check sees a loading replica as down); port 0 resolves."""
        net = self.config.network
        self._reserved = [reserve_port(net.host, net.port)]
        self.port = self._reserved[0].getsockname()[1]
        if net.http_port:
            self._reserved.append(reserve_port(net.host, net.http_port))
            self.http_port = self._reserved[1].getsockname()[1]

    def _release_reservations(self) -> None:
        for reserved in self._reserved:
            reserved.close()
        self._reserved = []

    async def _listen(self, port: int, http_port: int) -> None:
        """Open the gRPC port (and the HTTP door) for calls."""
        assert self.server is not None
        address = f"{self.config.network.host}:{port}"
        try:
            if self._credentials_for_port is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, self._credentials_for_port)
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {address}: {exc}") from None
        await self.server.start()
        self._listening = True
        if http_port:
            await self._start_http(http_port)
        log.info("listening on %s (port %d)", address, self.port)

    async def _serve_when_ready(self) -> None:
        """The model is warm: listen now where --listen-when-ready held the ports back, then
        take work and report SERVING."""
        assert self.admission is not None
        if self.config.network.listen_when_ready:
            # The listeners bind while the reservations still hold the ports (both sockets set
            # SO_REUSEADDR and the reservation never listens, so Linux allows it): a port
            # released first could be taken meanwhile, as any connection's ephemeral port.
            try:
                await self._listen(self.port, self.http_port)
            except StartupError as exc:
                log.error("%s", exc)
                self._on_engine_fatal(exc)
                return
            finally:
                self._release_reservations()
        if self._draining:
            return
        self.admission.ready = True
        await self._set_health(SERVING)
        log.info("serving chattts.v1.TextToSpeech on port %d", self.port)

    async def _start_http(self, port: int) -> None:
        """The HTTP front door in this loop (imported here: a gRPC-only server needs none of
        FastAPI)."""
        from .api.http.app import build_app
        from .api.http.serve import HTTPServer, HTTPServerError

        assert self.synthesis is not None and self.admission is not None
        cfg, admission = self.config, self.admission
        app = build_app(self.synthesis, lambda: admission.accepting, cfg.limits)
        self.http = HTTPServer(
            app, cfg.network.host, port, cfg.security, cfg.limits, cfg.network.http_idle_s
        )
        try:
            self.http_port = await self.http.start()
        except HTTPServerError as exc:
            raise StartupError(str(exc)) from None
        scheme = "https" if cfg.security.tls_cert else "http"
        log.info("HTTP front door on %s port %d (playground at /)", scheme, self.http_port)

    def _on_engine_ready(self) -> None:
        assert self.synthesis is not None and self.admission is not None
        self.synthesis.bind_model(self.engine.model_info)
        model = self.engine.model_info
        self.metrics.set_gpt_backend(model.backend, model.timing_source)
        governor = self.engine.thread_governor
        if governor is not None:
            self.metrics.bind_threads(
                lambda: governor.threads, lambda: governor.drops, lambda: governor.climbs
            )
        self.health.describe(self.engine.model_info)
        if self._draining:
            return
        asyncio.ensure_future(self._serve_when_ready())

    def _on_engine_fatal(self, exc: BaseException) -> None:
        self._fatal = exc
        if self.admission is not None:
            self.admission.ready = False  # refuse what still arrives: nothing can serve it
        log.error("engine is unusable; shutting down so a supervisor can restart us")
        asyncio.ensure_future(self.drain(grace_s=0))

    async def _set_health(self, status: int) -> None:
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)

    async def drain(self, grace_s: float | None = None) -> None:
        """Graceful stop, in the order of gRPC's graceful-shutdown guide
        (tests/integration/test_drain_transport.py watches it on the wire):

        1. Health NOT_SERVING (grpc.health.v1 and /health); each health Watch hears it and
           ends, so none holds its connection open through the drain.
        2. The doors shut: the listeners close (a proxy's TCP check and next connection are
           refused), and gRPC's stop sends GOAWAY on every connection, so neither a proxy nor a
           client opens a new stream on them. A stream that raced the GOAWAY is answered by
           grpc's core with no audio (CANCELLED), which the client library resends.
        3. Streams in flight, those queued before the drain, and any that reached admission
           before the doors shut (see `Admission.draining`) finish within the grace period;
           the rest are cancelled at its end.
        4. HTTP keep-alive connections still open stay open for --http-linger-s (a request
           still sent on one is served and answered Connection: close), then close, once every
           response and WebSocket stream has written its last message.
        5. Only then do the connections close and the process exit.

        A replica that kept listening only to refuse would pass a proxy's TCP check and, with
        fewer streams than its peers, draw every new call under least-connections balancing.
        """
        if self._draining:
            return
        self._draining = True
        loop = asyncio.get_running_loop()
        grace = self.config.admission.grace_s if grace_s is None else grace_s
        deadline = loop.time() + grace
        log.info(
            "draining: up to %.1f s for %d streams (%d of them queued)",
            grace,
            self.admission.held if self.admission else 0,
            self.admission.waiting if self.admission else 0,
        )
        grpc_stopped = await self._shut_doors(deadline)
        await self._wait_idle(deadline)
        if self.http is not None:
            linger_end = min(deadline, deadline - grace + self.config.admission.http_linger_s)
            await asyncio.sleep(max(0.0, linger_end - loop.time()))
            await self._wait_idle(deadline)  # what came in on those connections meanwhile
            await self.http.responses_sent(deadline)
            await self._sockets_done(deadline)
            await self.http.stop()  # cancels the HTTP streams still running after the grace
        if grpc_stopped is not None:
            await grpc_stopped
        await loop.run_in_executor(None, self.engine.stop)
        assert self._stopped is not None
        self._stopped.set()

    async def _shut_doors(self, deadline: float) -> asyncio.Future[None] | None:
        """Steps 1 and 2 of `drain`; the gRPC server's stop, which ends at `deadline`."""
        if self.admission is not None:
            self.admission.drain()
        await self.health.drain()
        if self.http is not None:
            self.http.stop_listening()
        if self.synthesis is not None and self.synthesis.resumer is not None:
            self.synthesis.resumer.drain()
        self._release_reservations()
        if self.server is None or not self._listening:
            return None
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        return asyncio.ensure_future(self.server.stop(timeout))

    async def _sockets_done(self, deadline: float) -> None:
        """Until every WebSocket stream has written its last message and closed
        (`Synthesis.socket_stream`), or `deadline` (loop time); polled, as responses are."""
        loop = asyncio.get_running_loop()
        while self.synthesis and self.synthesis.socket_streams and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def _wait_idle(self, deadline: float) -> None:
        """Until no stream is held, or `deadline` (loop time) passes."""
        if self.admission is None or not self.admission.held:
            return
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(timeout):
                await self.admission.wait_idle()
        except TimeoutError:
            log.warning("grace period over; cancelling %d streams", self.admission.held)

    @property
    def fatal(self) -> BaseException | None:
        """Why this server cannot serve (the engine failed, or a port could not be opened)."""
        return self._fatal

    async def wait(self) -> int:
        """Block until stopped; the process exit code (0, or 1 after an engine failure)."""
        assert self._stopped is not None
        await self._stopped.wait()
        return 1 if self._fatal is not None else 0

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.drain()))
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        self._reloads.add(task := asyncio.ensure_future(self.reload()))
        task.add_done_callback(self._reloads.discard)

    async def reload(self) -> None:
        """Re-read the voices folder and the --lexicon files (SIGHUP), one reload at a time. The
        lexicons are replaced all together or not at all: a file that no longer loads is logged
        with its line and the ones loaded before stay. A stream keeps the lexicons it was
        accepted with."""
        async with self._reload_lock:
            self.voices.reload()
            if not self.config.lexicon or self.synthesis is None:
                return
            try:
                library = await asyncio.to_thread(load_lexicons, self.config)
            except StartupError as exc:
                log.error("reload: %s; the lexicons loaded before are kept", exc)
                return
            self.synthesis.use_lexicons(library)
            log.info("reload: %d lexicons", len(library.names))
