"""Gateway throughput and overhead through the local API.

The gateway runs as `switchboard run` in its own process, the fake model
server in another, the load generator in this one (all on 127.0.0.1).

  (a) 100 sessions x 10 messages, model answers after 500 ms: total time beside the ideal
      (10 x 500 ms: a session's turns are sequential), and the gateway's own time per turn
      (what the client waited minus the time the model server held the request), p50/p99.
      Run twice: every session sending its first message at the same instant, then the sessions'
      starts spread evenly over --ramp seconds (one model delay by default), as users' would be.
  (b) the same with a model that answers at once: turns per second at saturation.
  (c) the gateway process's peak RSS (VmHWM).
  (d) the CPU one model call costs in the openai SDK client alone, and what that sets as a floor
      for (a) with every session sending at the same instant.
  (e) the CPU the usage ledger costs per model call (the recorder's row and the store's write,
      the daily roll-up included), in batches of 1 and of 100 calls (what 100 sessions answered
      within the recorder's half second give), as a share of (a)'s gateway CPU per turn.

    .venv/bin/python bench/gateway.py [--sessions 100] [--messages 10] [--ramp 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the gateway package, not this script (bench/gateway.py), for ``import gateway``

from tests.fakes.model_server import start_in_process as start_model

SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")




async def start_gateway(home: Path, model_port: int) -> tuple[asyncio.subprocess.Process, int]:
    home.parent.mkdir(parents=True, exist_ok=True)
    config = home.parent / "bench-config.yaml"
    config.write_text(yaml.safe_dump({
        "home": str(home),
        "model": {"base_url": f"http://127.0.0.1:{model_port}/v1", "name": "fake", "api_key": "x",
                  "max_concurrent_calls": 256},
        "api": {"port": 0},
        "logging": {"level": "WARNING", "format": "json"},
    }))
    sock_path = home.parent / "notify.sock"
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path)}
    proc = await asyncio.create_subprocess_exec(SWITCHBOARD, "run", "--config", str(config), env=env,
                                                stderr=asyncio.subprocess.DEVNULL)
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    while True:
        data = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 60)).decode()
        m = re.search(r"API on 127\.0\.0\.1:(\d+)", data)
        if m:
            sock.close()
            return proc, int(m.group(1))


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run_load(port: int, sessions: int, messages: int, tag: str,
                   ramp: float = 0.0) -> tuple[float, list[tuple[int, str, float, float]]]:
    """Each session sends its messages one after another; session ``i`` starts at ``ramp * i / sessions``.
    Returns the total time and, per turn, (message number in its session, text, sent at, latency),
    times from ``time.monotonic()`` (the system's clock, the same in every process)."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    turns: list[tuple[int, str, float, float]] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:
        async def conversation(i: int) -> None:
            await asyncio.sleep(ramp * i / sessions)
            for n in range(messages):
                text = f"{tag} {i} msg {n}"
                sent = time.monotonic()
                async with http.post(url, json={"messages": [{"role": "user", "content": text}]},
                                     headers={"X-Session-Key": f"{tag}-{i}"}) as r:
                    body = await r.json()
                    assert r.status == 200, body
                turns.append((n, text, sent, time.monotonic() - sent))

        started = time.monotonic()
        await asyncio.gather(*(conversation(i) for i in range(sessions)))
        return time.monotonic() - started, turns


async def model_seconds(model_port: int) -> dict[str, float]:
    """How long the model server held each request (by its last user message): the model's own time."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{model_port}/_timings") as r:
            return {t["last_user"]: t["answered"] - t["at"] for t in await r.json() if t["answered"]}


async def measure_a(args, port: int, model_port: int, pid: int, tag: str, ramp: float) -> float:
    cpu_before = cpu_seconds(pid)
    total, turns = await run_load(port, args.sessions, args.messages, tag, ramp)
    cpu_per_turn = (cpu_seconds(pid) - cpu_before) / len(turns) * 1000
    held = await model_seconds(model_port)
    ideal = ramp * (args.sessions - 1) / args.sessions + args.messages * args.delay
    # the gateway's own time: what the user waited minus what the model server took
    own = [(latency - held[text]) * 1000 for _, text, _, latency in turns]
    later = [(latency - held[text]) * 1000 for n, text, _, latency in turns if n > 0]
    start = "all at the same instant" if not ramp else f"evenly over the first {ramp * 1000:.0f} ms"
    print(f"    sessions starting {start}: total {total:.2f} s, ideal {ideal:.2f} s, ratio {total / ideal:.3f} "
          f"(target <= 1.2)")
    print(f"      gateway's own time per turn (latency minus the model server's time): "
          f"p50 {statistics.median(own):.1f} ms, p99 {pct(own, 0.99):.1f} ms (target p99 <= 15 ms); "
          f"leaving out each session's first turn (which creates it): p99 {pct(later, 0.99):.1f} ms")
    print(f"      gateway CPU per turn (all its threads): {cpu_per_turn:.2f} ms")
    return cpu_per_turn


async def sdk_cpu_per_call(model_port: int, calls: int = 300) -> float:
    """CPU (ms) of one chat completion through the SDK client the gateway builds, against the fake model."""
    import openai
    from openai.types.chat import ChatCompletion

    from gateway.model import http_client

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{model_port}/v1", api_key="x", max_retries=0,
                                http_client=http_client(8))
    body = {"model": "fake", "messages": [{"role": "system", "content": "You are helpful."}]
            + [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(9)]}
    try:
        for _ in range(20):
            await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        started = time.process_time()
        for _ in range(calls):
            await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        return (time.process_time() - started) / calls * 1000
    finally:
        await client.close()


async def ledger_cpu_per_call(tmp: Path, batch: int, calls: int = 2_000) -> float:
    """CPU (ms, all threads) per model call of writing the usage ledger as the daemon does: the
    recorder's priced row, then ``usage.record_calls`` through the async store, ``batch`` rows a
    write, into a ledger that already holds 20,000 rows over 30 days."""
    from gateway.usage import CallContext, ModelCall, UsageRecorder
    from state import AsyncSessionDB

    db = await AsyncSessionDB.open(tmp / f"ledger-{batch}.db")
    try:
        recorder = UsageRecorder(db, {})
        now = time.time()
        await db.usage.record_calls([
            {"at": now - i * 130, "session_id": None, "platform": "api", "chat_id": f"c{i % 300}",
             "user_id": f"u{i % 200}", "agent": "main", "purpose": "turn", "model": "fake", "outcome": "ok",
             "prompt_tokens": 900, "completion_tokens": 40} for i in range(20_000)])
        made = [ModelCall(CallContext("turn", None, "api", f"c{i % 300}", f"u{i % 200}", "main"), "fake", now,
                          480.0, "ok", prompt_tokens=900 + i % 50, completion_tokens=40, cached_tokens=i % 3 * 64)
                for i in range(calls)]
        for call in made[:batch * 2]:  # warm the statement cache
            await db.usage.record_calls([recorder.row(call)])
        started = time.process_time()
        for i in range(0, calls, batch):
            await db.usage.record_calls([recorder.row(call) for call in made[i:i + batch]])
        return (time.process_time() - started) / calls * 1000
    finally:
        await db.close()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--ramp", type=float, default=0.5,
                        help="(a) is also run with the sessions' starts spread evenly over this many seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        slow_model, slow_port = await start_model(args.delay)
        fast_model, fast_port = await start_model(0.0)
        try:
            gw, port = await start_gateway(Path(tmp) / "slow" / "home", slow_port)
            try:
                await run_load(port, 5, 1, "warmup")
                print(f"(a) {args.sessions} sessions x {args.messages} messages, model {args.delay * 1000:.0f} ms:")
                turn_cpu = [await measure_a(args, port, slow_port, gw.pid, "burst", 0.0),
                            await measure_a(args, port, slow_port, gw.pid, "ramp", args.ramp)]
                rss_a = peak_rss_mb(gw.pid)
            finally:
                gw.terminate()
                await gw.wait()
            gw, port = await start_gateway(Path(tmp) / "fast" / "home", fast_port)
            try:
                await run_load(port, 5, 1, "warmup")
                total, lat = await run_load(port, args.sessions, args.messages, "b")
                lat = [x for *_, x in lat]
                turns = args.sessions * args.messages
                print(f"(b) model answers at once: {turns} turns in {total:.2f} s = {turns / total:.0f} turns/s; "
                      f"latency p50 {statistics.median(lat) * 1000:.1f} ms, p99 {pct(lat, 0.99) * 1000:.1f} ms")
                rss_b = peak_rss_mb(gw.pid)
            finally:
                gw.terminate()
                await gw.wait()
            print(f"(c) gateway peak RSS: {max(rss_a, rss_b):.0f} MB (target <= 250 MB)")
            per_call = await sdk_cpu_per_call(fast_port)
            print(f"(d) the openai SDK alone (the gateway's client, in this process): {per_call:.2f} ms of CPU per call "
                  f"(request and response). When {args.sessions} sessions send at the same instant, their model calls "
                  f"alone need ~{args.sessions * per_call:.0f} ms of CPU, ~{args.sessions * per_call / os.cpu_count():.0f} ms "
                  f"on {os.cpu_count()} cores at best, all within the same moment, whatever else the gateway does")
            ledger = {batch: await ledger_cpu_per_call(Path(tmp), batch) for batch in (1, 100)}
            share = [ledger[batch] / min(turn_cpu) * 100 for batch in (1, 100)]
            print(f"(e) the usage ledger, per model call (a turn of (a) makes one): {ledger[1] * 1000:.0f} µs of CPU "
                  f"written alone, {ledger[100] * 1000:.0f} µs in a batch of 100; {share[0]:.1f} % and {share[1]:.1f} % "
                  f"of (a)'s lower gateway CPU per turn (target <= 2 %)")
        finally:
            for proc in (slow_model, fast_model):
                proc.terminate()
                await proc.wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
