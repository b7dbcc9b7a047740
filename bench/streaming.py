"""Streamed replies under load: many Telegram chats streaming at once through the real gateway.

The fake model runs in another process and streams each answer, about 4 characters (a token) per
chunk, ``--tokens`` chunks over ``--seconds``.  The real gateway and python-telegram-bot run in this
process against the fake Telegram, with the adapter's real limits: 25 calls a second per bot token
and one budget per chat (about 1 a second, a burst of 2).  Every chat sends one message at once.

Printed figures:

- the time from the model's first token (when the fake model sent it) to the first visible text in
  the chat (when the fake Telegram took the sendMessage), p50 / p99 / max;
- calls per chat (sends and edits), the most one chat got in any one second and in any minute;
- this process's CPU per turn, streamed and not streamed.  The in-process fake Telegram's share is
  in both figures, so their ratio is the figure to read.

    .venv/bin/python bench/streaming.py [--chats 50] [--seconds 8] [--tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.runtime.daemon import Gateway
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config

CHARS_PER_TOKEN = 4


async def start_model(seconds: float, tokens: int) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.model_server", "--stream-chunk-chars", str(CHARS_PER_TOKEN),
        "--stream-interval", str(seconds / tokens), "--reply-chars", str(tokens * CHARS_PER_TOKEN),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int((await proc.stdout.readline()).split()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def most_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


async def one_run(model_port: int, chats: int, streaming: bool, tag: str) -> float:
    """One message from each of ``chats`` users at once; prints the figures; returns CPU ms per turn."""
    async with FakeTelegram() as tg:
        with tempfile.TemporaryDirectory() as home:
            config = gateway_config(
                Path(home), f"http://127.0.0.1:{model_port}/v1", auth={"allow_all": True},
                logging={"level": "WARNING"}, model={"max_concurrent_calls": 64},
                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                streaming={"enabled": streaming},
            )
            gw = Gateway(config, serve_api=False)
            await gw.start()
            try:
                await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected",
                                  what="connected")
                cpu = time.process_time()
                for i in range(chats):
                    tg.dm(FakeTelegram.user(10_000 + i, f"user{i}"), f"go {i}")
                await tg.wait_for(lambda: len(tg.sent) == chats and all(m.parse_mode == "HTML" for m in tg.sent),
                                  timeout=600, what="every answer in its final form")
                cpu_ms = (time.process_time() - cpu) * 1000 / chats
            finally:
                await gw.stop(grace_seconds=5)
        timings = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{model_port}/_timings").read())
    first_token = {t["last_user"]: t["first_chunk"] for t in timings[-chats:]}
    first_shown, calls = {}, {}
    for r in tg.requests:
        chat = str(r.params.get("chat_id"))
        if r.method in ("sendMessage", "editMessageText"):
            calls.setdefault(chat, []).append(r.at)
            if r.method == "sendMessage":
                first_shown.setdefault(chat, r.at)
    waits = [first_shown[str(10_000 + i)] - first_token[f"go {i}"] for i in range(chats)
             if first_token.get(f"go {i}") is not None]
    print(f"  {tag}: {chats} chats")
    if waits:
        print(f"    model's first token -> first visible text: p50 {statistics.median(waits):.2f} s, "
              f"p99 {pct(waits, 0.99):.2f} s, max {max(waits):.2f} s")
    per_chat = [len(v) for v in calls.values()]
    print(f"    calls per chat (sends + edits): p50 {statistics.median(per_chat):.0f}, max {max(per_chat)}; "
          f"most to one chat in any 1 s: {max(most_in_window(v, 1.0) for v in calls.values())}, "
          f"in any 60 s: {max(most_in_window(v, 60.0) for v in calls.values())}")
    print(f"    CPU of this process per turn: {cpu_ms:.1f} ms")
    return cpu_ms


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    model, port = await start_model(args.seconds, args.tokens)
    try:
        print(f"streaming: {args.tokens} tokens over {args.seconds:.0f} s per answer")
        streamed = await one_run(port, args.chats, True, "streamed")
        whole = await one_run(port, args.chats, False, "not streamed")
        print(f"  CPU per streamed turn / per non-streamed turn: {streamed / whole:.2f}x")
    finally:
        model.terminate()
        await model.wait()


if __name__ == "__main__":
    asyncio.run(main())
