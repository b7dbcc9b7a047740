"""What OpenTelemetry traces cost the gateway: CPU per turn with the exporter off and on.

Three gateways run as `switchboard run` on fresh homes, and take the same load in turn, round after
round, through the local API (N sessions x M messages, a fake model that answers at once, so the
gateway's own work is what is measured): one with no OTEL_* variable (traces off, every tracing call
the shared no-op), one with OTEL_EXPORTER_OTLP_ENDPOINT naming an OTLP/HTTP receiver in this process,
which counts what it is sent (requests, bytes, spans and events): every trace kept, and one keeping
one in ten (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.1``).
Prints each gateway's CPU per turn (user + system of all its threads, from /proc), the difference in
percent, and what the SDK spends on a span and on an event, measured in this process.

``--turn tool`` measures the turn of bench/soak.py instead of the bare one: streamed to the client,
the model's answer streamed (400 characters, 8 to a chunk) after a call of the built-in
``session_search`` tool (two model calls, a tool call and its search).

    .venv/bin/python bench/traces.py [--sessions 50] [--messages 10] [--rounds 3] [--turn bare|tool]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import cpu_seconds, run_load, start_gateway
from bench.soak import DEFAULT_TOOL, start_model as start_tool_model, streamed_turn
from tests.fakes.model_server import start_in_process as start_model


class Receiver:
    """An OTLP/HTTP endpoint that answers 200 and counts what it is sent: requests, bytes, spans, events."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.spans = 0
        self.events = 0

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = await request.read()
        self.requests += 1
        self.bytes += len(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        for resource_spans in export.resource_spans:
            for scope in resource_spans.scope_spans:
                self.spans += len(scope.spans)
                self.events += sum(len(span.events) for span in scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")


async def start_with(home: Path, model_port: int, env: dict[str, str]) -> tuple[asyncio.subprocess.Process, int]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return await start_gateway(home, model_port)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def run_streamed(port: int, sessions: int, messages: int, tag: str) -> None:
    """run_load's sessions, each turn streamed to the client (bench/soak.py's turn)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def conversation(i: int) -> None:
            for n in range(messages):
                assert await streamed_turn(http, url, f"{tag}-{i}", f"{tag} {i} msg {n}: what about item {n}?")

        await asyncio.gather(*(conversation(i) for i in range(sessions)))


def sdk_costs(n: int = 20_000) -> tuple[float, float, float]:
    """In this process, µs of CPU: a span started and ended (as gateway.tracing starts them, with a
    model call's attributes), its OTLP encoding, and an event added to a running span."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("bench")
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
                  "gen_ai.request.model": "fake", "server.address": "127.0.0.1"}
    started = time.process_time()
    for _ in range(n):
        with tracer.start_as_current_span("chat fake", kind=SpanKind.CLIENT, attributes=attributes) as span:
            span.set_attributes({"gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 40,
                                 "gen_ai.response.finish_reasons": ("stop",)})
    span_us = (time.process_time() - started) / n * 1e6
    spans = kept.get_finished_spans()
    started = time.process_time()
    encode_spans(spans).SerializeToString()
    encode_us = (time.process_time() - started) / len(spans) * 1e6
    with tracer.start_as_current_span("turn") as turn:
        started = time.process_time()
        for _ in range(n):
            turn.add_event("store record_turn", {"db.operation.name": "record_turn", "switchboard.duration_ms": 1.5})
        event_us = (time.process_time() - started) / n * 1e6
    provider.shutdown()
    return span_us, encode_us, event_us


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turn", choices=("bare", "tool"), default="bare",
                        help="bare: a whole answer at once; tool: streamed, after a session_search call")
    args = parser.parse_args()
    receiver = Receiver()
    runner, url = await receiver.start()
    model, model_port = await (start_model(0.0) if args.turn == "bare" else start_tool_model(400, DEFAULT_TOOL))
    exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
    configs = {"off": {}, "on": exporting,
               "tenth": {**exporting, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                         "OTEL_TRACES_SAMPLER_ARG": "0.1"}}
    load = run_load if args.turn == "bare" else run_streamed
    turns = args.sessions * args.messages
    runs: dict[str, list[float]] = {name: [] for name in configs}
    gateways: dict[str, tuple[asyncio.subprocess.Process, int]] = {}
    loads = []
    sent = {"spans": 0, "events": 0, "turns": 0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, env in configs.items():
                gateways[name] = await start_with(Path(tmp) / name / "home", model_port, env)
                await load(gateways[name][1], 5, 2, "warmup")
            # the three in turn, round after round: a change in the machine's load falls on all of them
            for r in range(args.rounds):
                for name, (gw, port) in gateways.items():
                    if name == "on":
                        spans, events = receiver.spans, receiver.events
                    before = cpu_seconds(gw.pid)
                    await load(port, args.sessions, args.messages, f"r{r}")
                    loads.append(os.getloadavg()[0])
                    # the exporter's next export (it sends every second) is the round's too; every
                    # gateway is given the same time, idle, before its CPU is read
                    await asyncio.sleep(1.5)
                    runs[name].append((cpu_seconds(gw.pid) - before) / turns)
                    if name == "on":
                        sent["spans"] += receiver.spans - spans
                        sent["events"] += receiver.events - events
                        sent["turns"] += turns
    finally:
        for gw, _ in gateways.values():
            gw.terminate()
            await gw.wait()
        model.terminate()
        await model.wait()
        await runner.cleanup()
    m_off, m_on, m_tenth = (statistics.median(runs[name]) for name in configs)

    def rounds(name: str) -> str:
        return ", ".join(f"{x * 1000:.2f}" for x in runs[name])

    print(f"{args.rounds} rounds of {turns} turns ({args.sessions} sessions x {args.messages} messages) on each "
          f"of three gateways in turn, model answers at once"
          + ("" if args.turn == "bare" else ", streamed, after a session_search call")
          + f"; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    print(f"traces off: {m_off * 1000:.2f} ms of gateway CPU per turn (median; rounds {rounds('off')})")
    print(f"traces on:  {m_on * 1000:.2f} ms of gateway CPU per turn (median; rounds {rounds('on')}); "
          f"{receiver.requests} OTLP exports, {receiver.bytes / 2**10:.0f} KiB; "
          f"{sent['spans'] / max(sent['turns'], 1):.1f} spans and {sent['events'] / max(sent['turns'], 1):.1f} "
          f"events per turn; overhead {(m_on - m_off) / m_off * 100:+.1f} % CPU per turn (target <= 3 %)")
    print(f"traces on, one in ten kept: {m_tenth * 1000:.2f} ms (median; rounds {rounds('tenth')}); "
          f"overhead {(m_tenth - m_off) / m_off * 100:+.1f} %")

    def paired(name: str) -> str:  # each round beside the gateway without traces in the same round
        ratios = sorted((x / y - 1) * 100 for x, y in zip(runs[name], runs["off"], strict=True))
        return f"median {statistics.median(ratios):+.1f} % (rounds {', '.join(f'{r:+.0f}' for r in ratios)})"

    print(f"round by round beside traces off: every trace kept {paired('on')}; one in ten {paired('tenth')}")
    span_us, encode_us, event_us = sdk_costs()
    print(f"the OpenTelemetry SDK in this process: a span {span_us:.0f} µs of CPU to start and end, "
          f"{encode_us:.0f} µs to encode for OTLP (on the exporter's thread); an event {event_us:.1f} µs")


if __name__ == "__main__":
    asyncio.run(main())
