"""Fact retrieval at scale: p50/p95 of a search over 100,000 facts of one user, and memory per fact.

    .venv/bin/python bench/facts.py                  # 100,000 facts
    .venv/bin/python bench/facts.py --facts 20000    # a quick run

Builds ``bench/.data/facts-<n>.db`` once (facts made from templates over a
Zipf vocabulary of tech words, names and made-up words; every fact encoded
with ``gateway.memory.facts.hrr.encode_fact`` and stored through ``db.facts.add_many``)
and keeps it for later runs.  All facts belong to ONE (agent, user), the worst
case for the scope filter, plus a user with 10 % as many facts around them (also timed, for probe).

Timed: ``FactService.search`` exactly as the daemon calls it (AsyncSessionDB,
FTS5 recall of 3 × limit, Jaccard, HRR over the candidate matrix on a worker
thread, trust and decay), limit 5 as prefetch uses, for each mode and each
kind of query, ``--runs`` runs each after one untimed run.  Memory per fact:
the database file, the HRR blob, and the FTS index's share (dbstat).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import state
from gateway.memory.facts import hrr
from gateway.memory.facts.service import FactService, FactSettings

NOW = 1_800_000_000.0
AGENT, USER = "main", "telegram:1001"
SMALL = "telegram:2002"  # about 10,000 facts among the 100,000 of USER

_TECH = ("docker postgres redis nginx kubernetes grafana prometheus terraform ansible python rust golang "
         "sqlite kafka rabbitmq elasticsearch helm vault consul jenkins github gitlab vim emacs helix vscode "
         "linux debian ubuntu macos windows aws gcp azure hetzner cloudflare s3 minio backup cron systemd").split()
_NAMES = "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil trent".split()
_PLACES = "berlin lyon paris ghent lisbon oslo tokyo austin toronto madrid vienna prague".split()
_VERBS = ["uses", "prefers", "dislikes", "maintains", "deploys", "migrated to", "is learning", "switched to",
          "runs", "pays for", "recommends", "stopped using"]
_SYL = "ka lo mi ven tor qua zel rin bo sa tix dra mon pel vor xi nu gar fle shi jor wex pru lan cy".split()
_CAUSES = ["it is faster", "the team knows it", "the old one kept crashing", "it costs less", "the client asked",
           "backups were failing", "latency was too high", "it has better docs"]

QUERIES = {
    "one common name": "docker",
    "question": "what does the team run with grafana, and why?",
    "rare word": None,  # filled with a made-up word that occurs in a few facts
    "person + place": "does carol live in lisbon",
    "long message": ("hey, quick one before the meeting: the postgres backups on hetzner failed again last night, "
                     "can you remind me what we decided about moving them to s3 and who maintains the cron job?"),
}


def _zipf_pick(rng: random.Random, items: list[str], s: float = 1.1) -> str:
    weights = [1 / (i + 1) ** s for i in range(len(items))]
    return rng.choices(items, weights)[0]


def _made_up(rng: random.Random) -> str:
    return "".join(rng.choice(_SYL) for _ in range(rng.randint(2, 4)))


def make_fact(rng: random.Random, tail: list[str]) -> tuple[str, list[str]]:
    who = rng.choice(["The user", "The user's team", rng.choice(_NAMES).title()])
    thing = _zipf_pick(rng, _TECH + tail)
    kind = rng.random()
    if kind < 0.35:
        other = _zipf_pick(rng, _TECH)
        return f"{who} {rng.choice(_VERBS)} {thing} with {other}", [thing, other]
    if kind < 0.6:
        return f"{who} {rng.choice(_VERBS)} {thing} because {rng.choice(_CAUSES)}", [thing]
    if kind < 0.8:
        place = rng.choice(_PLACES)
        return f"{who} runs {thing} on a server in {place.title()}", [thing, place]
    name = rng.choice(_NAMES)
    return f"{name.title()} lives in {rng.choice(_PLACES).title()} and {rng.choice(_VERBS)} {thing}", [name, thing]


def build(path: Path, n: int) -> str:
    """Create the database (unless it exists); returns the rare word planted in it."""
    rng = random.Random(9)
    tail = [_made_up(rng) for _ in range(5000)]
    rare = tail[-1]
    if path.exists():
        return rare
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    db = state.SessionDB(tmp)
    started = time.perf_counter()
    owners = [USER] * 10 + [SMALL]
    made = 0
    pending: dict[str, list[dict]] = {}

    def flush() -> None:
        for owner, rows in pending.items():
            db.facts.add_many(AGENT, owner, rows, now=NOW - rng.uniform(0, 365) * 86400)
        pending.clear()

    while made < n:
        owner = rng.choice(owners)
        content, ents = make_fact(rng, tail)
        if rng.random() < 0.0003:
            content, ents = f"{content} next to {rare}", ents + [rare]
        pending.setdefault(owner, []).append({
            "content": content, "entities": ents, "session_id": None, "trust": rng.uniform(0.3, 1.0),
            "hrr": hrr.to_blob(hrr.encode_fact(content, ents))})
        if owner == USER:
            made += 1
            if made % 5000 == 0:
                flush()
                print(f"  {made:,} facts of the user stored ({time.perf_counter() - started:.0f}s)", file=sys.stderr)
    flush()
    db.checkpoint("TRUNCATE")
    db.close()
    tmp.rename(path)
    return rare


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def memory_report(path: Path) -> None:
    conn = sqlite3.connect(path)
    total = conn.execute("SELECT count(*) FROM facts").fetchone()[0]
    n_user = conn.execute("SELECT count(*) FROM facts WHERE user_scope = ?", (USER,)).fetchone()[0]
    size = path.stat().st_size
    print(f"\nfacts in the file: {total:,} ({n_user:,} of the benchmarked user)")
    print(f"database file: {size / 2**20:,.1f} MiB = {size / total:,.0f} bytes per fact")
    avg_text = conn.execute("SELECT avg(length(content) + length(entities)) FROM facts").fetchone()[0]
    print(f"HRR vector: {4 * hrr.DEFAULT_DIM:,} bytes per fact (float32 x {hrr.DEFAULT_DIM}); "
          f"text + entities: {avg_text:,.0f} bytes on average")
    try:
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat WHERE name LIKE 'facts%' OR name LIKE 'idx_facts%' "
                            "GROUP BY name ORDER BY 2 DESC").fetchall()
        for name, pages in rows:
            print(f"  {name:28s} {pages / 2**20:8.1f} MiB  {pages / total:8,.0f} bytes per fact")
    except sqlite3.OperationalError:
        print("  (this SQLite has no dbstat table: no per-table breakdown)")
    print(f"in process during a search: 3 x limit candidate vectors ({3 * 5 * 4 * hrr.DEFAULT_DIM / 1024:.0f} KiB "
          "for limit 5); nothing is held per fact")


async def measure(path: Path, rare: str, runs: int) -> None:
    queries = dict(QUERIES, **{"rare word": f"anything about {rare}?"})
    adb = await state.AsyncSessionDB.open(path)
    service = FactService(adb, FactSettings(), clock=lambda: NOW)
    all_times: list[float] = []
    print(f"\n{'mode':10s} {'query':18s} {'found':>5s} {'p50 ms':>8s} {'p95 ms':>8s}")
    try:
        for mode in ("probe", "related", "reason", "contradict"):
            for label, q in queries.items():
                found = await service.search(AGENT, USER, q, mode=mode, limit=5)  # untimed: warm the cache
                times = []
                for _ in range(runs):
                    t = time.perf_counter()
                    await service.search(AGENT, USER, q, mode=mode, limit=5)
                    times.append((time.perf_counter() - t) * 1000)
                all_times += times
                print(f"{mode:10s} {label:18s} {len(found):5d} {_pct(times, 0.5):8.1f} {_pct(times, 0.95):8.1f}")
        # a user with 10x fewer facts among the big one's: the scope token joins the MATCH (the crowded path)
        for label, q in queries.items():
            await service.search(AGENT, SMALL, q, limit=5)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                await service.search(AGENT, SMALL, q, limit=5)
                times.append((time.perf_counter() - t) * 1000)
            all_times += times
            print(f"{'probe/small':10s} {label:18s} {'':5s} {_pct(times, 0.5):8.1f} {_pct(times, 0.95):8.1f}")
    finally:
        await adb.close()
    print(f"\nall searches: p50 {_pct(all_times, 0.5):.1f} ms, p95 {_pct(all_times, 0.95):.1f} ms, "
          f"max {max(all_times):.1f} ms over {len(all_times)} (target: p95 <= 30 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=100_000, help="facts of the benchmarked user")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    path = Path(__file__).resolve().parent / ".data" / f"facts-{args.facts}.db"
    print(f"building {path} ..." if not path.exists() else f"using {path}", file=sys.stderr)
    rare = build(path, args.facts)
    memory_report(path)
    asyncio.run(measure(path, rare, args.runs))


if __name__ == "__main__":
    main()
