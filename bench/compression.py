"""How long the gateway itself takes to compress a 500-message session (target: 50 ms at most).

A real ``AsyncSessionDB`` under a temp dir holds ``--runs`` sessions of 500
messages each (user questions, assistant answers, tool calls with their
results, some Chinese); each is compressed once by ``compress_session`` with
a summarizer that answers at once, so the figure is our own work: reading the
session, planning, building and redacting the request, creating the child,
copying head + summary + tail, moving the route and ending the parent.  The
pure part (plan + request, on a worker thread in the daemon) is timed on its
own too.

    .venv/bin/python bench/compression.py [--runs 30] [--messages 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compression import build_summary_request, compress_session, plan
from state import AsyncSessionDB

TARGET_MS = 50.0
CONTEXT_LENGTH = 128_000

_WORDS = (
    "the deploy failed because the container could not reach the database on port 5432 so I restarted "
    "the service and checked the logs in /var/log/app which showed a timeout after thirty seconds then "
    "we changed the config to use the replica and the tests passed except one flaky test in the api"
).split()
_CJK = "数据库连接超时我们重启了服务并检查了日志配置文件已经更新测试通过"


def _text(rng: random.Random, words: int) -> str:
    if rng.random() < 0.1:
        return "".join(rng.choice(_CJK) for _ in range(words))
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def make_session(seed: int, n: int) -> list[dict]:
    """``n`` messages of a plausible long conversation, about 100k tokens for 500 messages."""
    rng = random.Random(seed)
    out: list[dict] = []
    t = 1_700_000_000.0
    i = 0
    while len(out) < n:
        t += 30
        out.append({"role": "user", "content": _text(rng, rng.randint(10, 80)), "timestamp": t,
                    "platform_message_id": f"m{i}"})
        if rng.random() < 0.3 and len(out) + 3 <= n:
            call_id = f"call_{i}"
            out.append({"role": "assistant", "content": None, "timestamp": t + 1, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "shell", "arguments": json.dumps({"cmd": _text(rng, 6)})}}]})
            out.append({"role": "tool", "tool_call_id": call_id, "tool_name": "shell",
                        "content": _text(rng, rng.randint(100, 900)), "timestamp": t + 2})
        out.append({"role": "assistant", "content": _text(rng, rng.randint(40, 300)), "timestamp": t + 3})
        i += 1
    return out[:n]


async def _instant(messages: list[dict]) -> str:
    return "Goals: finish the migration.\nFacts: replica at db-2:5432.\nRemaining work: rerun the flaky test."


class _Ticker:
    """Measures how late the event loop wakes a sleeper while a compression runs."""

    def __init__(self) -> None:
        self.stop = False
        self.longest = 0.0

    async def run(self) -> None:
        # wakes every 2 ms (a busy loop would compete with the compression for the GIL)
        while not self.stop:
            before = time.perf_counter()
            await asyncio.sleep(0.002)
            self.longest = max(self.longest, time.perf_counter() - before - 0.002)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


async def run(runs: int, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        adb = await AsyncSessionDB.open(Path(tmp) / "state.db")
        try:
            sessions = []
            for r in range(runs + 1):  # one extra to warm up
                sid = f"bench_{r:03d}"
                await adb.sessions.create(sid, "telegram", "gpt-4o", "u1", session_key=f"telegram:dm:{r}",
                                         title=f"bench chat {r}", system_prompt="You are Switchboard.")
                await adb.routes.set(f"telegram:dm:{r}", sid)
                await adb.messages.append_many(sid, make_session(r, n))
                sessions.append(sid)
            await adb.checkpoint("TRUNCATE")

            totals: list[float] = []
            pure: list[float] = []
            stalls: list[float] = []
            result = None
            for index, sid in enumerate(sessions):
                ticker = _Ticker()
                tick = asyncio.create_task(ticker.run())
                await asyncio.sleep(0)
                start = time.perf_counter()
                result = await compress_session(adb, sid, _instant, context_length=CONTEXT_LENGTH)
                elapsed = (time.perf_counter() - start) * 1000
                ticker.stop = True
                await tick
                stored = [m.as_dict() for m in await adb.messages.get(sid)]
                start = time.perf_counter()
                cut = plan(stored, context_length=CONTEXT_LENGTH)
                build_summary_request(cut)
                pure_ms = (time.perf_counter() - start) * 1000
                if index == 0:
                    continue  # warm-up
                totals.append(elapsed)
                pure.append(pure_ms)
                stalls.append(ticker.longest * 1000)
        finally:
            await adb.close()

    p50, p95 = statistics.median(totals), _pct(totals, 95)
    load = os.getloadavg()[0]
    print(f"compress_session, {n}-message session, summarizer excluded, {runs} runs "
          f"({os.cpu_count()} CPUs, load average {load:.1f}):")
    print(f"  total      p50 {p50:6.1f} ms   p95 {p95:6.1f} ms   max {max(totals):6.1f} ms   (target <= {TARGET_MS:g} ms)")
    print(f"  plan+prompt p50 {statistics.median(pure):6.1f} ms   p95 {_pct(pure, 95):6.1f} ms")
    print(f"  event loop: longest stall during a compression p50 {statistics.median(stalls):5.1f} ms   "
          f"max {max(stalls):5.1f} ms (what another chat would wait)")
    print(f"  last run: {result.describe()}")
    # The verdict is on the median: p95 on a shared machine measures the neighbours too.
    ok = p50 <= TARGET_MS
    print("  " + ("OK: p50 within target" if ok else f"SLOWER THAN TARGET: p50 {p50:.1f} ms > {TARGET_MS:g} ms"))
    return 0  # a benchmark prints figures; a slow machine is not a failure (make bench runs them all)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--messages", type=int, default=500)
    args = parser.parse_args()
    return asyncio.run(run(args.runs, args.messages))


if __name__ == "__main__":
    sys.exit(main())
