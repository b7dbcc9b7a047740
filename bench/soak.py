"""A compressed soak: RSS, file descriptors, threads and store size per simulated hour of steady traffic.

The gateway runs as `switchboard run` in its own process (as in bench/gateway.py), the fake model in
another, the load from this one, all on 127.0.0.1.  Turns arrive on a fixed schedule, ``--rate`` a
second whatever the answers take (open loop: a slow gateway falls behind, and the output says by
how much), each one a streamed request (``"stream": true``) to the local API whose answer goes
through a tool: the fake model answers every request that offers tools and ends with the user's
message with a call of ``--tool`` (by default the built-in ``session_search`` with a query, a search
of the store's full-text index; each API session is its own user here, so it finds no earlier session
to summarize), then answers the tool's result with ``--reply-chars`` characters of text, streamed 8
characters to a chunk.

Time is compressed: one simulated "hour" is ``--turns-per-hour`` turns (360 by default: 36 seconds at
10 turns/s), so 24 hours run in 14.4 minutes.  Each hour uses ``--sessions`` new conversations
(session keys ``h<hour>-<n>``), as new users would arrive, so the store keeps growing.  The store's
upkeep runs as the daemon configures it (a pass 5 s after start, the sizes and the WAL's limit every
5 minutes); retention (``store.retention_days``, at least a day) prunes nothing in a run of minutes.

Each hour prints turns so far, the gateway's RSS (MiB), open fds, threads, the store's size (state.db
and its WAL), the hour's p50/p99 latency and errors; at the end the RSS growth per hour after
warm-up: the least-squares slope over hours 2..N, against the target of under 16 MiB/h (LangBot
gates its releases at 32 MiB/h).

    .venv/bin/python bench/soak.py [--hours 24] [--turns-per-hour 360] [--rate 10] [--sessions 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import cpu_seconds, pct, start_gateway

DEFAULT_TOOL = '{"name": "session_search", "arguments": {"query": "soak", "limit": 1}}'


def proc_status(pid: int) -> dict[str, float]:
    """The gateway's RSS (MiB), threads and open file descriptors, from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def store_mib(home: Path) -> tuple[float, float]:
    def size(name: str) -> float:
        try:
            return (home / name).stat().st_size / 2**20
        except FileNotFoundError:
            return 0.0
    return size("state.db"), size("state.db-wal")


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def start_model(reply_chars: int, tool: str) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.model_server", "--reply-chars", str(reply_chars), "--tool-loop", tool,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    line = (await proc.stdout.readline()).decode()  # type: ignore[union-attr]
    return proc, int(line.split()[1])


async def streamed_turn(http: aiohttp.ClientSession, url: str, key: str, text: str) -> str:
    """One streamed request; returns the answer's text (the SSE chunks joined)."""
    parts: list[str] = []
    async with http.post(url, json={"messages": [{"role": "user", "content": text}], "stream": True},
                         headers={"X-Session-Key": key}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--turns-per-hour", type=int, default=360, help="turns in one simulated hour")
    parser.add_argument("--rate", type=float, default=10.0, help="turns per second (wall clock)")
    parser.add_argument("--sessions", type=int, default=30, help="new conversations each simulated hour")
    parser.add_argument("--reply-chars", type=int, default=400, help="length of each streamed answer")
    parser.add_argument("--tool", default=DEFAULT_TOOL, help="the tool call every turn makes (JSON)")
    args = parser.parse_args()

    per_hour = args.turns_per_hour
    print(f"one simulated hour = {per_hour} turns = {per_hour / args.rate:.0f} s of wall clock at {args.rate:g} "
          f"turns/s; {args.hours} hours = {args.hours * per_hour} turns, {args.hours * per_hour / args.rate / 60:.1f} "
          f"min; streamed, every turn calls {json.loads(args.tool)['name']}, answers of {args.reply_chars} chars; "
          f"{args.sessions} new sessions an hour", flush=True)
    model, model_port = await start_model(args.reply_chars, args.tool)
    tmp = tempfile.TemporaryDirectory(prefix="sb-soak-")
    home = Path(tmp.name) / "home"
    gw, port = await start_gateway(home, model_port)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    rows: list[dict[str, float]] = []
    errors: list[str] = []
    latencies: list[float] = []
    tasks: set[asyncio.Task] = set()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as http:
            async def turn(key: str, text: str) -> None:
                sent = time.monotonic()
                try:
                    answer = await streamed_turn(http, url, key, text)
                    if not answer:
                        raise RuntimeError("an empty answer")
                    latencies.append(time.monotonic() - sent)
                except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError, ValueError) as exc:  # counted, shown
                    errors.append(f"{key}: {exc!r}"[:300])

            before = proc_status(gw.pid)
            db, wal = store_mib(home)
            print(f"hour  0: turns      0, RSS {before['rss']:6.1f} MiB, fds {before['fds']:4.0f}, "
                  f"threads {before['threads']:3.0f}, store {db:6.1f} MiB + WAL {wal:5.1f} MiB", flush=True)
            cpu0 = cpu_seconds(gw.pid)
            started = time.monotonic()
            behind_max = 0.0
            for hour in range(1, args.hours + 1):
                latencies.clear()
                errors_before = len(errors)
                cpu_before = cpu_seconds(gw.pid)
                for n in range(per_hour):
                    k = (hour - 1) * per_hour + n
                    due = started + k / args.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    else:
                        behind_max = max(behind_max, -wait)
                    task = asyncio.create_task(turn(f"h{hour}-{n % args.sessions}",
                                                    f"soak hour {hour} turn {n}: what did we say about item {k}?"))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                # the hour ends when its turns are answered (a backlog would blur the next hour's figures)
                if tasks:
                    await asyncio.gather(*list(tasks))
                st = proc_status(gw.pid)
                db, wal = store_mib(home)
                row = {"hour": hour, **st, "db": db, "wal": wal}
                rows.append(row)
                lat = sorted(latencies)
                cpu_ms = (cpu_seconds(gw.pid) - cpu_before) / per_hour * 1000
                print(f"hour {hour:2d}: turns {hour * per_hour:6d}, RSS {st['rss']:6.1f} MiB, fds {st['fds']:4.0f}, "
                      f"threads {st['threads']:3.0f}, store {db:6.1f} MiB + WAL {wal:5.1f} MiB; "
                      f"latency p50 {statistics.median(lat) * 1000 if lat else float('nan'):.0f} ms, "
                      f"p99 {pct(lat, 0.99) * 1000 if lat else float('nan'):.0f} ms; "
                      f"CPU {cpu_ms:.1f} ms/turn; errors {len(errors) - errors_before}; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
            wall = time.monotonic() - started
            cpu_total = cpu_seconds(gw.pid) - cpu0
            async with http.get(f"http://127.0.0.1:{model_port}/_timings") as r:
                model_calls = len(await r.json())
    finally:
        gw.terminate()
        await gw.wait()
        model.terminate()
        await model.wait()
        tmp.cleanup()
    turns = args.hours * per_hour
    print(f"{turns} turns in {wall:.0f} s ({turns / wall:.2f} turns/s; a turn sent at most {behind_max:.2f} s late), "
          f"{len(errors)} errors; {model_calls / turns:.2f} model calls per turn (the one asking for the tool, the "
          f"answer; a session_search that finds another session of its user adds a summary); gateway CPU {cpu_total / turns * 1000:.1f} ms per turn", flush=True)
    for e in errors[:5]:
        print(f"  error: {e}")
    after = [r for r in rows if r["hour"] >= 2]
    if len(after) >= 2:
        hours = [r["hour"] for r in after]
        rss_slope = slope(hours, [r["rss"] for r in after])
        per_real_hour = rss_slope / per_hour * args.rate * 3600
        print(f"RSS growth after warm-up (least-squares slope over hours 2..{args.hours}): {rss_slope:+.2f} MiB per "
              f"simulated hour ({per_hour} turns) = {rss_slope / per_hour * 1000:+.3f} MiB per 1,000 turns = "
              f"{per_real_hour:+.1f} MiB per real hour at {args.rate:g} turns/s ({args.rate * 3600:,.0f} turns), "
              f"if it went on at that rate (target < 16 MiB/h; LangBot gates at 32 MiB/h); RSS {rows[0]['rss']:.1f} MiB after hour 1, {rows[-1]['rss']:.1f} MiB at "
              f"the end, peak {max(r['rss'] for r in rows):.1f} MiB")
        print(f"fds: {min(r['fds'] for r in after):.0f}-{max(r['fds'] for r in after):.0f} after hour 1 "
              f"(slope {slope(hours, [r['fds'] for r in after]):+.2f}/h); threads "
              f"{min(r['threads'] for r in after):.0f}-{max(r['threads'] for r in after):.0f}; store "
              f"{slope(hours, [r['db'] for r in after]):+.2f} MiB/h, WAL at most {max(r['wal'] for r in rows):.1f} MiB")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
