#!/usr/bin/env python3
"""Exit 0 if a gRPC server reports SERVING on grpc.health.v1, else 1.

The image's Docker HEALTHCHECK (Kubernetes uses its native gRPC probe instead). Prints one line
with the status or the error, which `docker inspect` shows under State.Health.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:50051", help="host:port (default %(default)s)")
    p.add_argument("--service", default="", help="service name; '' is the whole server")
    p.add_argument("--timeout-s", type=float, default=3.0)
    p.add_argument("--ca", help="CA bundle (PEM): use TLS")
    p.add_argument("--cert", help="client certificate (PEM), for mutual TLS")
    p.add_argument("--key", help="client private key (PEM), for mutual TLS")
    p.add_argument("--server-name", help="TLS name to verify when it differs from --addr's host")
    return p


def _channel(args: argparse.Namespace) -> grpc.Channel:
    if not args.ca:
        return grpc.insecure_channel(args.addr)
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(args.ca).read_bytes(),
        private_key=Path(args.key).read_bytes() if args.key else None,
        certificate_chain=Path(args.cert).read_bytes() if args.cert else None,
    )
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    return grpc.secure_channel(args.addr, creds, options=options)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with _channel(args) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s
            )
        except grpc.RpcError as err:
            print(f"unhealthy: {err.code().name}: {err.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
