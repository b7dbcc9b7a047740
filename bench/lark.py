"""Feishu / Lark: event to reply request over the long connection.

The real adapter (its long connection in lark-oapi's frames, the open API over aiohttp) and the
real gateway in this process, against tests/fakes/lark.py and the fake model server in another
process, answering at once (the model is out of the figure).  1,000 DMs from 50 chats are pushed
at a steady rate; a message's latency runs from the moment the fake pushes its frame to the moment
it receives the reply's POST (a message the gateway answered together with a later one of its
chat counts to that reply).  The adapter's outbound pacing is raised for the run.

    .venv/bin/python bench/lark.py [--messages 1000] [--chats 50] [--rate 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.adapters import GATEWAY, UNPACED, inject, start_model, wait_until
from tests.harness import running_gateway


async def bench(args, home: Path) -> None:
    from adapters.lark import LarkAdapter, LarkConfig
    from tests.fakes.lark import FakeLark

    proc, model = await start_model()
    try:
        async with FakeLark() as lark:
            config = LarkConfig(app_id=lark.app_id, app_secret=lark.app_secret, base_url=lark.base_url)
            adapter = LarkAdapter(config, chat_rate=UNPACED)
            async with running_gateway(home, model, adapters={"lark": adapter}, **GATEWAY):
                await wait_until(lambda: adapter.health().state == "connected", 30, "lark to connect")
                events = [lark.message(f"oc_dm_{i % args.chats}", f"ou_{i % args.chats}", f"bench {i}")
                          for i in range(args.messages)]
                injected = await inject(args.messages, args.rate, lambda i: lark.send_event(events[i]))
                replies = lambda: [(int(s.text.split("bench ")[1].split(" ")[0]), s.at)  # noqa: E731
                                   for shown in lark.chats.values() for s in shown]
                last = {c: max(i for i in range(args.messages) if i % args.chats == c) for c in range(args.chats)}
                await wait_until(lambda: set(last.values()) <= {n for n, _ in replies()}, 120, "lark replies",
                                 lambda: f"{len(replies())} replies")
                arrived: dict[int, float] = {}
                for n, at in sorted(replies(), key=lambda r: r[1]):
                    for i in range(n, -1, -args.chats):
                        arrived.setdefault(i, at)
                count = len(replies())
        ms = sorted((arrived[i] - injected[i]) * 1000 for i in range(args.messages))
        print(f"lark: {args.messages} messages, {count} replies ({args.messages - count} answered together with the "
              f"next in their chat)")
        print(f"lark: event to reply request p50 {statistics.median(ms):.1f} ms  "
              f"p95 {ms[min(len(ms) - 1, int(0.95 * len(ms)))]:.1f} ms  max {ms[-1]:.1f} ms")
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100.0, help="events pushed per second")
    args = parser.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench(args, Path(tmp) / "home"))
    print(f"lark: ran {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
