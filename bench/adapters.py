"""The gateway's time from an inbound platform event to the reply's send request, per platform.

For each platform: the real adapter on its real library against the local fake
platform server (in this process), the real gateway (in this process), and the
fake model server in another process answering at once.  1,000 DMs from 50
chats are injected at a steady rate; a message's latency runs from the moment
the fake platform publishes it to the moment the fake receives the reply's
send request, so it includes the library's receive path, the router, two
SQLite writes and a read, the model round trip and the library's send path.
The adapters' outbound rate limits are raised for the run: the benchmark
measures the gateway, not the platform's pacing.

    .venv/bin/python bench/adapters.py [--messages 1000] [--chats 50] [--rate 100] [--only telegram]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.ratelimit import ChatRate
from tests.harness import running_gateway

UNPACED = ChatRate(rate=1e6, burst=1_000_000, min_gap=0.0)

# Replies whole (bench/streaming.py measures streaming), and no platform pacing: the gateway is measured.
GATEWAY = {"auth": {"allow_all": True}, "logging": {"level": "WARNING"}, "model": {"max_concurrent_calls": 64},
           "streaming": {"enabled": False}}


async def start_model() -> tuple[asyncio.subprocess.Process, SimpleNamespace]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.fakes.model_server", cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE)
    port = int((await proc.stdout.readline()).split()[1])
    return proc, SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")


async def wait_until(predicate, timeout: float, what: str, progress=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}" + (f" ({progress()})" if progress else ""))
        await asyncio.sleep(0.005)


async def inject(count: int, rate: float, send_one) -> dict[int, float]:
    gc.collect()
    gc.freeze()  # as `switchboard run` does once started (gateway/runtime/daemon.py)
    sent_at: dict[int, float] = {}
    started = time.monotonic()
    for i in range(count):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent_at[i] = time.monotonic()
        await send_one(i)
    return sent_at


def report(name: str, latencies: list[float]) -> None:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(f"{name:9} {len(ms)} replies: p50 {statistics.median(ms):6.1f} ms  p99 {p99:6.1f} ms  max {ms[-1]:6.1f} ms"
          f"  (target p99 <= 25 ms)")


async def bench_telegram(model, args, home: Path) -> list[float]:
    from adapters.telegram import TelegramAdapter, TelegramConfig
    from tests.fakes.telegram import FakeTelegram

    async with FakeTelegram() as tg:
        adapter = TelegramAdapter(TelegramConfig(token=tg.token, base_url=tg.base_url), rate_per_second=1e6,
                                  rate_burst=1_000_000, chat_rate=UNPACED, group_rate=UNPACED)
        async with running_gateway(home, model, adapters={"telegram": adapter}, **GATEWAY):
            await wait_until(lambda: adapter.health().state == "connected", 30, "telegram to connect")
            users = [tg.user(1000 + c, f"User{c}") for c in range(args.chats)]
            injected = await inject(args.messages, args.rate, lambda i: _async(tg.dm(users[i % args.chats], f"bench {i}")))
            await wait_until(lambda: len(tg.sent) >= args.messages, 60, "telegram replies",
                             lambda: f"{len(tg.sent)} sent; updates confirmed up to {tg.confirmed_offset}")
            arrived = {}
            for rec in tg.requests:
                if rec.method.lower() == "sendmessage":
                    arrived[int(str(rec.params["text"]).split("bench ")[1].split(" ")[0])] = rec.at
            return [arrived[i] - injected[i] for i in range(args.messages)]


async def bench_discord(model, args, home: Path) -> list[float]:
    from adapters.discord import DiscordAdapter, DiscordConfig
    from tests.fakes.discord import FakeDiscord

    async with FakeDiscord() as dc:
        adapter = DiscordAdapter(DiscordConfig(token=dc.token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url),
                                 send_rate=1e6, send_burst=1_000_000, channel_rate=UNPACED)
        async with running_gateway(home, model, adapters={"discord": adapter}, **GATEWAY):
            await wait_until(lambda: adapter.health().state == "connected", 30, "discord to connect")
            users = [dc.add_user(f"user{c}") for c in range(args.chats)]
            injected = await inject(args.messages, args.rate, lambda i: dc.dm(users[i % args.chats], f"bench {i}"))
            await wait_until(lambda: len(dc.sent()) >= args.messages, 120, "discord replies")
            arrived = {}
            for rec in dc.requests:
                if rec.method == "POST" and rec.path.endswith("/messages") and "bench " in str(rec.body):
                    arrived[int(str(rec.body["content"]).split("bench ")[1].split(" ")[0])] = rec.at
            return [arrived[i] - injected[i] for i in range(args.messages)]


async def bench_slack(model, args, home: Path) -> list[float]:
    from adapters.slack import SlackAdapter, SlackConfig
    from tests.fakes.slack import FakeSlack

    async with FakeSlack() as sl:
        adapter = SlackAdapter(SlackConfig(bot_token=sl.bot_token, app_token=sl.app_token, api_base_url=sl.base_url),
                               send_rate=1e6, send_burst=1_000_000, channel_rate=UNPACED)
        async with running_gateway(home, model, adapters={"slack": adapter}, **GATEWAY):
            await wait_until(lambda: adapter.health().state == "connected", 30, "slack to connect")
            injected = await inject(args.messages, args.rate, lambda i: sl.send_event(
                sl.message(f"D{i % args.chats}", f"U{i % args.chats}", f"bench {i}")))
            await wait_until(lambda: len(sl.calls_to("chat.postMessage")) >= args.messages, 120, "slack replies")
            arrived = {int(str(c.body["text"]).split("bench ")[1].split(" ")[0]): c.at
                       for c in sl.calls_to("chat.postMessage")}
            return [arrived[i] - injected[i] for i in range(args.messages)]


async def _async(value):
    return value


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100.0, help="messages injected per second")
    parser.add_argument("--only", choices=["telegram", "discord", "slack"])
    args = parser.parse_args()
    benches = {"telegram": bench_telegram, "discord": bench_discord, "slack": bench_slack}
    if args.only is None:
        # each platform in a fresh process, so one library's leftovers never load another's figures
        for name in benches:
            child = await asyncio.create_subprocess_exec(sys.executable, __file__, *sys.argv[1:], "--only", name)
            await child.wait()
        return
    proc, model = await start_model()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, bench in benches.items():
                if args.only and name != args.only:
                    continue
                report(name, await bench(model, args, Path(tmp) / name))
    finally:
        proc.terminate()
        await proc.wait()


if __name__ == "__main__":
    import uvloop  # the daemon's loop (switchboard run)

    uvloop.run(main())
