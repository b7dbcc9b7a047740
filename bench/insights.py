"""``switchboard insights``' query over a large usage ledger, and ``/usage``'s for one user.

    .venv/bin/python bench/insights.py                  # 1,000,000 ledger rows over 60 days
    .venv/bin/python bench/insights.py --rows 100000

The rows (20,000 sessions, 3 models, 7 purposes, 2,000 user ids and 3,000 chat ids each
seen on all 4 platforms: 8,000 accounts and 12,000 chats, nearly all active every day) are
written in time order through ``db.usage.record_calls``, as the daemon writes
them (the daily roll-ups with them), into a database in a temporary directory, removed
afterwards.  Prints the time of ``db.usage.summary`` plus
:func:`gateway.insights.from_summary` (what ``switchboard insights`` runs) for ``--days``
(half the rows) per grouping, with ``--top`` (20) and, by user and chat, ``--top 0``;
and of one user's report (``/usage``); best and median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.insights import from_summary, window
from state import SessionDB

PURPOSES = ["turn", "tool_loop", "compression", "recall", "memory_flush", "fact_extraction", "cron"]


def build(path: Path, rows: int, now: float) -> None:
    rng = random.Random(1)
    times = sorted(now - rng.random() * 60 * 86_400 for _ in range(rows))
    with SessionDB(path) as db:
        for start in range(0, rows, 50_000):
            db.usage.record_calls([
                {"at": at, "session_id": f"s{i % 20_000}", "platform": rng.choice(["telegram", "discord", "slack", "api"]),
                 "chat_id": f"c{i % 3_000}", "user_id": f"u{i % 2_000}", "agent": "main", "purpose": rng.choice(PURPOSES),
                 "model": rng.choice(["gpt-4o", "gpt-4o-mini", "local"]), "prompt_tokens": rng.randint(100, 20_000),
                 "completion_tokens": rng.randint(10, 800), "cached_tokens": rng.randint(0, 100), "latency_ms": 800.0,
                 "outcome": "ok", "price_input": 2.0, "price_output": 8.0, "price_cached_input": 0.5, "cost": 0.001}
                for i, at in enumerate(times[start:start + 50_000], start)])


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=20, help="the groups shown (insights --top; 0: all)")
    args = parser.parse_args()
    args.top = args.top or None
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        started = time.perf_counter()
        build(path, args.rows, now)
        print(f"{args.rows:,} ledger rows written in {time.perf_counter() - started:.1f} s")
        since, dates = window(args.days, now)
        with SessionDB(path) as db:
            runs = [(by, None if by == "day" else args.top) for by in ("model", "day", "purpose", "platform", "user",
                                                                     "chat")]
            for by, limit in runs + [("user", None), ("chat", None)]:
                best, median = timed(lambda by=by, limit=limit: from_summary(
                    db.usage.summary(since, by, limit=limit), dates, limit=limit), args.repeat)
                top = "" if by == "day" else f" --top {limit or 0:<2}"
                print(f"insights --days {args.days} --by {by:<8}{top:9}  best {best:7.0f} ms  median {median:7.0f} ms")
            best, median = timed(lambda: db.usage.report(since, "day", platform="telegram", user_id="u7"),
                                 args.repeat)
            print(f"/usage (one user, {args.days} days)       best {best:7.1f} ms  median {median:7.1f} ms")


if __name__ == "__main__":
    main()
