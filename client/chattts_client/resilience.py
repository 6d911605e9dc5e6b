"""What lets a client ride out replicas that restart, drain or die: the default gRPC service
config (round robin, retry of UNAVAILABLE, UNKNOWN or a server's CANCELLED before the first
response, streams included) and keepalive that finds a peer that stopped answering.
`ClientOptions(service_config=None, keepalive=False)` turns them off. docs/replicas.md
gives the same JSON for clients in other languages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SERVICE = "chattts.v1.TextToSpeech"
SERVICE_CONFIG: dict[str, Any] = {
    # One subchannel per address (a list target, or a DNS name with one record per replica);
    # a replica that drains or dies drops out of the rotation, one that comes back rejoins.
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [
                {"service": SERVICE, "method": "Synthesize"},
                {"service": SERVICE, "method": "StreamingSynthesize"},
                {"service": SERVICE, "method": "ListVoices"},
            ],
            # grpc resends a call only until its first response arrives (our server sends its
            # headers with the first audio), a stream with the text it had sent (grpc keeps up
            # to 256 KiB of it for this): a call refused by a starting or draining replica, or
            # cut before it spoke. A grpc-retry-pushback-ms from the server overrides the
            # backoff. UNKNOWN too: what a proxy answers for a stream it cut before any
            # response (HAProxy ends it without trailers when its replica dies). CANCELLED
            # too: what grpc's server core answers a stream that reached it after its GOAWAY
            # went out (a proxy's pooled connection racing the drain; the app never sees it,
            # tests/integration/test_drain_transport.py). The caller's own cancel is never
            # retried, and a call that had audio is committed, so it still fails and says so.
            # Five attempts at most (grpc's own cap), 1.5 s of backoff in all.
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "UNKNOWN", "CANCELLED"],
            },
        }
    ],
}
"""The default gRPC service config. Other languages: pass `json.dumps(SERVICE_CONFIG)` as the
channel's default service config."""

# A peer that stops answering (node lost, process frozen, a network that drops packets) is found
# within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS of silence: the call fails UNAVAILABLE instead
# of hanging. Our server allows a ping a second (grpc.http2.min_recv_ping_interval_without_data_ms).
# Another server may allow fewer (grpc's default: one per 5 min while it sends nothing) and answer
# faster pings with GOAWAY too_many_pings: there, keepalive=False.
KEEPALIVE_TIME_MS = 3_000
KEEPALIVE_TIMEOUT_MS = 2_000
# A replica that restarts is reconnected within this, not after grpc's default of up to 120 s.
MAX_RECONNECT_BACKOFF_MS = 2_000


def channel_options(
    service_config: Mapping[str, Any] | None, keepalive: bool
) -> list[tuple[str, Any]]:
    """The channel options for retries and load balancing (`service_config`), keepalive and
    flow control."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        # The receive window stays 64 KiB (0.7 s of 24 kHz PCM): bandwidth probing grows it to
        # megabytes, a minute of audio that a caller who stopped reading would hide from the
        # server's stall timeout. 64 KiB a round trip is still many times real time.
        ("grpc.http2.bdp_probe", 0),
    ]
    if service_config is not None:
        options += [("grpc.service_config", json.dumps(service_config)), ("grpc.enable_retries", 1)]
    else:
        options.append(("grpc.enable_retries", 0))
    if keepalive:
        options += [
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 0),
            # grpc stops pinging after 2 pings without sending data; a caller waiting for its
            # LLM's next sentence sends none, and that is when a dead peer must be found.
            ("grpc.http2.max_pings_without_data", 0),
            # The ack wait that really closes the transport (grpc's default is a minute; the
            # keepalive timeout alone left a frozen peer's stream hanging to its deadline).
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ]
    return options
