"""`chattts-server`: parse flags, fetch `--model` into the Hugging Face cache, start the server,
serve until SIGTERM/SIGINT, exit 0 (1 on engine failure, 2 on a start-up error)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from .config import ConfigError
from .config_cli import config_from_args
from .threads import configure_threads

if TYPE_CHECKING:
    from .server import TTSServer


async def _serve(server: TTSServer) -> int:
    await server.start()
    server.install_signal_handlers()
    http = f" (http {server.http_port})" if server.http_port else ""
    # One write: with unbuffered stdout, print() writes the text and its newline separately,
    # and a log line from the loading thread can land between them ("...port 336372026-12-02").
    sys.stdout.write(f"chattts-server listening on port {server.port}{http}\n")
    sys.stdout.flush()
    return await server.wait()


def main(argv: list[str] | None = None) -> int:
    try:
        config = config_from_args(argv)
    except ConfigError as exc:
        print(f"chattts-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if config.model.model is not None:
        # Before torch loads: a hub that cannot be reached or a wrong token shows in seconds.
        from .model.errors import ModelLoadError
        from .model.hub import resolved

        try:
            config = replace(config, model=resolved(config.model))
        except ModelLoadError as exc:  # HubError, or an unreadable --sha256-map
            print(f"chattts-server: {exc}", file=sys.stderr)
            return 2
        if config.download_only:
            return 0
    # Before torch loads (the server's imports load it): OpenMP reads its settings then, and
    # the inter-op pool can be sized only before its first use.
    configure_threads(config.model.threads or None, config.model.adaptive_threads)
    # Long-running CUDA serving allocates many differently sized activations: expandable
    # segments let the caching allocator grow blocks instead of fragmenting (read at CUDA init).
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    from .server import TTSServer
    from .startup import StartupError

    try:
        return asyncio.run(_serve(TTSServer(config)))
    except StartupError as exc:
        print(f"chattts-server: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
