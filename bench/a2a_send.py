"""A2A ``SendMessage`` round trip: ``a2a-sdk``'s client to the real gateway's A2A endpoint and back, with a
fake model (another process) that answers at once, so what is measured is the endpoint, the store, the
router and the turn.

Each caller sends its messages one after another, ``--per-context`` of them in one context (a session)
before it starts another, waiting for each answer (``SendMessage`` blocking, the answer in the returned task); ``--callers`` of them at once.
Printed figures: the round trip p50 / p95 / max, turns per second, and this process's CPU per turn
(the gateway and the SDK clients together: both run here).

    .venv/bin/python bench/a2a_send.py [--messages 300] [--callers 1] [--per-context 10] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import start_in_process
from tests.harness import gateway_config

TOKEN = "bench-token-0123456789abcdef0123"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def caller(base: str, messages: int, stream: bool, times: list[float], per_context: int) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        client = await create_client(base, ClientConfig(streaming=stream, httpx_client=http))
        context = str(uuid.uuid4())
        for i in range(messages):
            if i and i % per_context == 0:
                context = str(uuid.uuid4())  # a new conversation: its session starts afresh
            message = pb.Message(message_id=uuid.uuid4().hex, role=pb.ROLE_USER, context_id=context,
                                 parts=[pb.Part(text=f"message {i}: how is the weather?")])
            started = time.perf_counter()
            last = None
            async for event in client.send_message(pb.SendMessageRequest(message=message)):
                last = event
            times.append(time.perf_counter() - started)
            state = last.task.status.state if last is not None and last.HasField("task") else \
                last.status_update.status.state if last is not None else None
            if state != pb.TASK_STATE_COMPLETED:
                raise SystemExit(f"message {i} ended {state}, not completed")


async def main(args: argparse.Namespace) -> None:
    proc, port = await start_in_process(0.0)
    try:
        with tempfile.TemporaryDirectory() as home:
            cfg = gateway_config(Path(home), f"http://127.0.0.1:{port}/v1", logging={"level": "WARNING"},
                                 sessions={"reset": {"mode": "none"}},
                                 a2a={"enabled": True, "callers": {"bench": {"token": TOKEN}}})
            gw = Gateway(cfg, adapters={})
            await gw.start()
            try:
                base = f"http://127.0.0.1:{gw.api.bound_port}"
                await caller(base, 5, args.stream, [], args.per_context)  # warm up: connections, the first session
                times: list[float] = []
                cpu, wall = time.process_time(), time.perf_counter()
                await asyncio.gather(*(caller(base, args.messages // args.callers, args.stream, times, args.per_context)
                                       for _ in range(args.callers)))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            finally:
                await gw.stop(grace_seconds=5)
    finally:
        proc.kill()
        await proc.wait()
    ms = [t * 1000 for t in times]
    kind = "SendStreamingMessage" if args.stream else "SendMessage"
    print(f"{kind} round trip, {len(ms)} messages, {args.callers} caller(s), model answering at once:")
    print(f"  p50 {statistics.median(ms):.1f} ms, p95 {pct(ms, 0.95):.1f} ms, max {max(ms):.1f} ms")
    print(f"  load average {os.getloadavg()[0]:.1f}; {len(ms) / wall:.0f} turns/s; this process's CPU {cpu * 1000 / len(ms):.1f} ms per turn "
          "(gateway and SDK clients together)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--callers", type=int, default=1)
    parser.add_argument("--per-context", type=int, default=10, help="messages per context (session) before a new one")
    parser.add_argument("--stream", action="store_true", help="SendStreamingMessage instead of SendMessage")
    asyncio.run(main(parser.parse_args()))
