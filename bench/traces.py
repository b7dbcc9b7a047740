"""What OpenTelemetry traces cost the gateway: CPU per turn with the exporter off and on.

The gateway runs as `switchboard run` twice on fresh homes, the same load each time through the
local API (N sessions x M messages, a fake model that answers at once, so the gateway's own work is
what is measured): first with no OTEL_* variable (traces off, every tracing call the shared no-op),
then with OTEL_EXPORTER_OTLP_ENDPOINT naming an OTLP/HTTP receiver in this process, which counts
what it is sent: every trace kept, then one in ten (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``,
``OTEL_TRACES_SAMPLER_ARG=0.1``).  Prints the gateway process's CPU seconds per turn (user + system,
from /proc) for each, and the difference in percent.

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
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import cpu_seconds, run_load, start_gateway
from bench.soak import DEFAULT_TOOL, start_model as start_tool_model, streamed_turn
from tests.fakes.model_server import start_in_process as start_model


class Receiver:
    """An OTLP/HTTP endpoint that answers 200 and counts the request bodies (it does not decode them)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.bytes += len(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")


async def cpu_per_turn(home: Path, model_port: int, args, env: dict[str, str]) -> list[float]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        gw, port = await start_gateway(home, model_port)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        load = run_load if args.turn == "bare" else run_streamed
        await load(port, 5, 2, "warmup")
        runs = []
        for r in range(args.rounds):
            before = cpu_seconds(gw.pid)
            await load(port, args.sessions, args.messages, f"r{r}")
            runs.append((cpu_seconds(gw.pid) - before) / (args.sessions * args.messages))
        return runs
    finally:
        gw.terminate()
        await gw.wait()


async def run_streamed(port: int, sessions: int, messages: int, tag: str) -> None:
    """run_load's sessions, each turn streamed to the client (bench/soak.py's turn)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def conversation(i: int) -> None:
            for n in range(messages):
                assert await streamed_turn(http, url, f"{tag}-{i}", f"{tag} {i} msg {n}: what about item {n}?")

        await asyncio.gather(*(conversation(i) for i in range(sessions)))


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
    try:
        with tempfile.TemporaryDirectory() as tmp:
            off = await cpu_per_turn(Path(tmp) / "off" / "home", model_port, args, {})
            on = await cpu_per_turn(Path(tmp) / "on" / "home", model_port, args,
                                    {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "1000"})
            exports = receiver.requests, receiver.bytes
            tenth = await cpu_per_turn(Path(tmp) / "tenth" / "home", model_port, args,
                                       {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "1000",
                                        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                        "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    finally:
        model.terminate()
        await model.wait()
        await runner.cleanup()
    turns = args.sessions * args.messages
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"{args.rounds} rounds of {turns} turns ({args.sessions} sessions x {args.messages} messages), "
          f"model answers at once" + ("" if args.turn == "bare" else ", streamed, after a session_search call"))
    print(f"traces off: {m_off * 1000:.2f} ms of gateway CPU per turn (median; rounds "
          f"{', '.join(f'{x * 1000:.2f}' for x in off)})")
    print(f"traces on:  {m_on * 1000:.2f} ms of gateway CPU per turn (median; rounds "
          f"{', '.join(f'{x * 1000:.2f}' for x in on)}); {exports[0]} OTLP exports, {exports[1] / 2**10:.0f} KiB; "
          f"overhead {(m_on - m_off) / m_off * 100:+.1f} % CPU per turn (target <= 3 %)")
    m_tenth = statistics.median(tenth)
    print(f"traces on, one in ten kept: {m_tenth * 1000:.2f} ms (median; rounds "
          f"{', '.join(f'{x * 1000:.2f}' for x in tenth)}); overhead {(m_tenth - m_off) / m_off * 100:+.1f} %")


if __name__ == "__main__":
    asyncio.run(main())
