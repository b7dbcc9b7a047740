"""The dashboard's sessions page with 50,000 sessions: time to first byte (target <= 100 ms).

    .venv/bin/python bench/dashboard.py                    # 50,000 sessions, 3 messages each
    .venv/bin/python bench/dashboard.py --sessions 5000 --repeat 50

The store holds the corpus sessions of ``bench/list_sessions.py`` (``bench._corpus``: about 10 %
Chinese), built in a temporary directory and removed afterwards.  A real gateway serves the
dashboard (``ui.enabled``, ``api.token`` set); an aiohttp client logs in with the form, as a
browser would, then asks for each page ``--repeat`` times, one request at a time.

Time to first byte is from sending the request to having the response's status line and headers
(aiohttp reads them before the body); "whole" adds reading the body.  The page is rendered whole
before its first byte is sent, so the two differ by the transfer only.  Prints p50/p95/max per page.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from bench.list_sessions import corpus_records
from gateway.config import config_from_dict
from gateway.runtime.daemon import Gateway
from state import SessionDB

TOKEN = "bench-dashboard-token"


async def measure(base: str, paths: list[tuple[str, str]], repeat: int) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(base + "/ui/login") as r:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)
        async with http.post(base + "/ui/login", data={"csrf": csrf, "token": TOKEN}, allow_redirects=False) as r:
            assert r.status == 303, f"log-in failed: {r.status}"
        print(f"{'page':<44} {'bytes':>8} {'TTFB p50':>9} {'p95':>8} {'max':>8} {'whole p50':>10}  (ms)")
        for label, path in paths:
            first: list[float] = []
            whole: list[float] = []
            size = 0
            for i in range(repeat + 1):
                start = time.perf_counter()
                async with http.get(base + path, allow_redirects=False) as r:
                    headers_at = time.perf_counter()
                    body = await r.read()
                    done_at = time.perf_counter()
                    assert r.status == 200, f"{path}: {r.status}"
                if i == 0:
                    continue  # the first asks warm the page cache and the template cache
                size = len(body)
                first.append((headers_at - start) * 1000)
                whole.append((done_at - start) * 1000)
            first.sort()
            print(f"{label:<44} {size:>8,} {statistics.median(first):>9.2f} {first[int(len(first) * 0.95) - 1]:>8.2f} "
                  f"{first[-1]:>8.2f} {statistics.median(whole):>10.2f}", flush=True)


async def serve_and_measure(home: Path, repeat: int) -> None:
    cfg = config_from_dict({
        "home": str(home), "model": {"base_url": "http://127.0.0.1:9/v1", "name": "bench-model", "api_key": "unused",
                  "context_length": 32768},
        "api": {"host": "127.0.0.1", "port": 0, "token": TOKEN}, "ui": {"enabled": True},
        "logging": {"level": "WARNING"}, "facts": {"enabled": False},
    })
    gw = Gateway(cfg, adapters={})
    await gw.start()
    try:
        first = (await gw.db.sessions.list_rich(limit=1))[0]["id"]
        paths = [
            ("sessions (50 newest)", "/ui/sessions"),
            ("sessions, platform=telegram", "/ui/sessions?platform=telegram"),
            ("sessions, page 10", "/ui/sessions?page=10"),
            ("sessions, title contains 'zzzz' (none)", "/ui/sessions?title=zzzz"),
            ("sessions, search 'deploy'", "/ui/sessions?q=deploy"),
            ("one transcript", f"/ui/sessions/{first}"),
            ("health", "/ui/"),
        ]
        await measure(f"http://127.0.0.1:{gw.api.bound_port}", paths, repeat)
    finally:
        await gw.stop(grace_seconds=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=50_000)
    parser.add_argument("--messages-per-session", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{args.sessions:,} sessions x {args.messages_per_session} messages; {args.repeat} requests per page")
    t0 = time.perf_counter()
    records = corpus_records(args.sessions, args.messages_per_session)
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as tmp:
        home = Path(tmp)
        with SessionDB(home / "state.db") as db:
            db.transfer.import_sessions(enumerate(records, 1))
            db.checkpoint("TRUNCATE")
        print(f"built the store in {time.perf_counter() - t0:.0f} s")
        asyncio.run(serve_and_measure(home, args.repeat))


if __name__ == "__main__":
    main()
