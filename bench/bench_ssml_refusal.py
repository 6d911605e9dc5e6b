"""How fast hostile SSML is refused: billion laughs, an external entity, an external DTD.

Issue 27 asks these to be refused in under 100 ms with nothing expanded. Each document goes
through the SSML parser (text/ssml, expat through defusedxml) `--repeats` times; the figure is
the slowest and the median refusal. For scale, the same is timed for a navigation prompt that
parses, and for the billion-laughs document through plain `xml.etree` with a small expansion
(a 10^3-fold one: the full 10^9 would not finish), which shows what is avoided.

Then each hostile document is sent as a `Synthesize` with `text_format = SSML` over gRPC and
the time to its INVALID_ARGUMENT is measured (client to client): against `--target HOST:PORT`,
or a `chattts-server` started here on the tiny random-weight dev model (`--in-process-only`
skips it). Prints its figures; writes nothing.

Usage: python bench/bench_ssml_refusal.py [--repeats 200] [--target HOST:PORT | --in-process-only]
       python bench/bench_ssml_refusal.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

from chattts_server.errors import InvalidRequestError  # noqa: E402
from chattts_server.text.ssml import ssml_items  # noqa: E402


def billion_laughs(levels: int = 9) -> str:
    """The classic: `levels` entities each ten of the one before (10^9 'lol's at 9)."""
    lines = ['<?xml version="1.0"?>', "<!DOCTYPE speak [", ' <!ENTITY lol0 "lol">']
    lines += [f' <!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, levels + 1)]
    return "\n".join([*lines, "]>", f"<speak>&lol{levels};</speak>"])


HOSTILE = {
    "billion laughs": billion_laughs(),
    "external entity": (
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
        "<speak>&xxe;</speak>"
    ),
    "external DTD": '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/ssml.dtd"><speak>x</speak>',
}
PROMPT = (
    '<speak>In <say-as interpret-as="cardinal">200</say-as> meters, turn left.'
    '<break time="500ms"/> Then take exit <say-as interpret-as="characters">12B</say-as> '
    'toward I-95 N.<mark name="exit"/></speak>'
)


def timed_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def refused(doc: str) -> Callable[[], None]:
    def run() -> None:
        try:
            ssml_items(doc, 30.0, 5)
        except InvalidRequestError as exc:
            assert "document type declaration" in exc.description, exc.description
            return
        raise AssertionError("not refused")

    return run


def report(name: str, times_ms: list[float]) -> None:
    print(
        f"{name:<34} median {statistics.median(times_ms):8.3f} ms   "
        f"max {max(times_ms):8.3f} ms   ({len(times_ms)} runs)"
    )


def over_grpc(target: str, repeats: int) -> float:
    """Time each refusal over gRPC; the slowest, in ms."""
    import grpc

    from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

    slowest = 0.0
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for name, doc in HOSTILE.items():
            request = tts_pb2.SynthesizeRequest(
                text=doc, config=tts_pb2.SynthesisConfig(text_format=tts_pb2.SSML)
            )

            def call(request: tts_pb2.SynthesizeRequest = request) -> None:
                try:
                    list(stub.Synthesize(request, timeout=10))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
                    return
                raise AssertionError("not refused")

            call()  # the channel connected, the first call's setup out of the figures
            times = timed_ms(call, repeats)
            slowest = max(slowest, max(times))
            report(f"{name} over gRPC", times)
    return slowest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--target", help="time Synthesize refusals against HOST:PORT")
    parser.add_argument("--in-process-only", action="store_true", help="start no server")
    parser.add_argument("--smoke", action="store_true", help="a few repeats of each")
    args = parser.parse_args()
    repeats = 3 if args.smoke else args.repeats
    slowest = 0.0
    for name, doc in HOSTILE.items():
        times = timed_ms(refused(doc), repeats)
        slowest = max(slowest, max(times))
        report(f"{name} refused", times)
    report("navigation prompt parsed", timed_ms(lambda: ssml_items(PROMPT, 30.0, 5), repeats))
    small = billion_laughs(3)  # 1000 'lol's: what a parser that expands entities does
    report("3-level laughs expanded (xml.etree)", timed_ms(lambda: ET.fromstring(small), repeats))
    print(f"slowest refusal in-process: {slowest:.3f} ms (target: under 100 ms)")
    if args.target or not args.in_process_only:
        from chattts_devtools.launcher import bench_server

        with bench_server(args) as target:
            slowest = max(slowest, over_grpc(target, repeats))
    print(f"slowest refusal: {slowest:.3f} ms (target: under 100 ms)")
    return 0 if args.smoke or slowest < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
