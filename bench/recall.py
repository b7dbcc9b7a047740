"""Recall latency: from the ``session_search`` tool call to the summarizer requests being sent.

    .venv/bin/python bench/recall.py                     # 1,000,000 messages
    .venv/bin/python bench/recall.py --messages 100000   # a quicker run

The store is ``bench/_stores.py``'s "ours" database of ``bench._corpus``
messages (built once), copied to ``bench/.data/recall-<n>/state.db`` with every
session given one of ``--users`` users and a session key of agent ``main``
(``agent:main:<platform>:dm:<user>``), so a search is scoped the way the
daemon scopes it.  The real gateway runs in this process over that home, with
the fake model server answering at once.

For each query of ``bench._corpus.QUERIES`` and ``--runs`` random users (plus
the operator, whose scope is everything), the tool is called the way the
agent turn calls it (``gw.tools.call``) and the time is taken from the call to
the moment the fake model has received the last summarizer request of that
search: recall, grouping, lineage exclusion, loading, formatting and
truncation -- everything but the model.  Printed: p50/p95 per query, how
many sessions each search summarized, and the overall p95 against the 150 ms
target.  Searches that find nothing send no request and are counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _stores
from bench._corpus import QUERIES
from gateway.tools import ToolContext
from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway

TARGET_P95_MS = 150.0
OPERATOR = ("slack", "UOPERATOR")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def prepare(n: int, users: int) -> Path:
    """The home holding a scoped copy of the n-message store (made once)."""
    home = _stores.DATA / f"recall-{n}-u{users}"
    db = home / "state.db"
    if db.exists():
        return home
    source = _stores.build("ours", n)
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / "state.db.copying"
    print(f"copying {source.name} to {db} and assigning {users} users ...", flush=True)
    shutil.copyfile(source, tmp)
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        "UPDATE sessions SET user_id = 'u' || (rowid % ?),"
        " session_key = 'agent:main:' || source || ':dm:u' || (rowid % ?)",
        (users, users),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(db)
    return home


async def run(home: Path, runs: int, users: int, seed: int) -> None:
    rng = random.Random(seed)
    async with FakeModel() as model:
        async with running_gateway(home, model, identities={"ops": [":".join(OPERATOR)]},
                                   auth={"owner": "ops"}) as gw:
            conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
            accounts = [tuple(a) for a in conn.execute(
                "SELECT DISTINCT source, user_id FROM sessions WHERE source IN ('telegram', 'discord', 'slack')"
                " ORDER BY source, user_id")]
            conn.close()
            print(f"store: {await gw.db.messages.count():,} messages, {await gw.db.sessions.count():,} sessions, "
                  f"{len(accounts)} accounts ({users} users x platforms)\n")
            all_ms: list[float] = []
            print(f"{'query':<22} {'scope':<9} {'p50 ms':>8} {'p95 ms':>8} {'sessions':>9} {'empty':>6}")
            for label, query in QUERIES.items():
                for scope in ("user", "operator"):
                    times, found, empty = [], [], 0
                    for i in range(runs + 1):
                        platform, user = OPERATOR if scope == "operator" else rng.choice(accounts)
                        ctx = ToolContext(session_id="bench-current", session_key=f"agent:main:{platform}:dm:{user}",
                                          platform=platform, user_id=user, agent="main")
                        before = len(model.requests)
                        t0 = time.monotonic()
                        await gw.tools.call("session_search", json.dumps({"query": query}), ctx)
                        sent = model.requests[before:]
                        if i == 0:
                            continue  # warm-up
                        if not sent:
                            empty += 1
                            continue
                        times.append((max(r.at for r in sent) - t0) * 1000)
                        found.append(len(sent))
                    all_ms += times
                    print(f"{label:<22} {scope:<9} {_pct(times, 0.5):>8.1f} {_pct(times, 0.95):>8.1f} "
                          f"{(sum(found) / len(found) if found else 0):>9.1f} {empty:>6}")
            p95 = _pct(all_ms, 0.95)
            verdict = "meets" if p95 <= TARGET_P95_MS else "MISSES"
            print(f"\nall searches that reached the summarizer: n={len(all_ms)}, p50 {_pct(all_ms, 0.5):.1f} ms, "
                  f"p95 {p95:.1f} ms ({verdict} the {TARGET_P95_MS:.0f} ms target)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    home = prepare(args.messages, args.users)
    asyncio.run(run(home, args.runs, args.users, args.seed))


if __name__ == "__main__":
    main()
