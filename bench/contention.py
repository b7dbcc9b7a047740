"""Write contention: 1, 4 and 8 writer processes appending messages, the two-copy store (``seed``, see bench/README.md) beside ours.

    .venv/bin/python bench/contention.py                  # 1, 4, 8 writers; 3 rounds of 2 s each
    .venv/bin/python bench/contention.py --seconds 1 --rounds 1 --writers 1 8

Each writer process appends single messages (one transaction each) to its own
session as fast as it can for ``--seconds``, timing every append; all writers
start at the same instant.  Prints the aggregate messages/s (appends finished
inside that window of ``--seconds``, per second), p50/p99/max write latency, errors surfaced to the caller
(a failed append is a lost message) and rows lost (appends reported as stored
but missing from the database afterwards).

* ``seed``: the original design's contention handling: a 1 s SQLite busy timeout, then up
  to 15 application retries sleeping 20-150 ms at random, ``BEGIN IMMEDIATE``,
  a PASSIVE checkpoint every 50 writes; over the seed's tables with both FTS5
  tables (unicode61 and trigram over every message), ``synchronous=NORMAL``.
* ``ours``: ``db.messages.append`` (writers queue on a kernel
  lock in front of SQLite's, patience 10 s measured in time; the search
  design of ``state.search.fts5``).

Databases live in a temporary directory that is removed afterwards; nothing
touches ``~/.switchboard``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import Corpus
from bench._stores import SEED_SCHEMA
from state import SessionDB


class SeedStore:
    """The original design's write path, reproduced for comparison."""

    RETRIES, MIN_S, MAX_S, CHECKPOINT_EVERY = 15, 0.020, 0.150, 50

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.writes = 0

    @staticmethod
    def create(path: Path) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        for stmt in SEED_SCHEMA:
            conn.execute(stmt)
        conn.close()

    def create_session(self, session_id: str, source: str) -> None:
        self._write(lambda c: c.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, ?, ?)",
                                        (session_id, source, time.time())))

    def append_message(self, session_id: str, role: str, content: str) -> int:
        def op(c):
            cur = c.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                            (session_id, role, content, time.time()))
            c.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = ?", (session_id,))
            return cur.lastrowid
        return self._write(op)

    def _write(self, op):
        for attempt in range(self.RETRIES):
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    result = op(self.conn)
                    self.conn.execute("COMMIT")
                except BaseException:
                    self.conn.execute("ROLLBACK")
                    raise
                self.writes += 1
                if self.writes % self.CHECKPOINT_EVERY == 0:
                    try:
                        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    except sqlite3.OperationalError:
                        pass
                return result
            except sqlite3.OperationalError as exc:
                if ("locked" in str(exc) or "busy" in str(exc)) and attempt < self.RETRIES - 1:
                    time.sleep(random.uniform(self.MIN_S, self.MAX_S))
                    continue
                raise
        raise AssertionError("unreachable")

    def count(self, session_id: str) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]

    def close(self) -> None:
        self.conn.close()


class OurStore:
    def __init__(self, path: Path):
        self.db = SessionDB(path)

    @staticmethod
    def create(path: Path) -> None:
        SessionDB(path).close()

    def create_session(self, session_id: str, source: str) -> None:
        self.db.sessions.create(session_id, source)

    def append_message(self, session_id: str, role: str, content: str) -> int:
        return self.db.messages.append(session_id, role, content)

    def count(self, session_id: str) -> int:
        return self.db.messages.count(session_id)

    def close(self) -> None:
        self.db.close()


STORES = {"seed": SeedStore, "ours": OurStore}


def _texts(worker: int, n: int = 2000) -> list[tuple[str, str]]:
    corpus = Corpus(seed=100 + worker)
    return [(row[1], row[2] or "(tool call)") for row in corpus.messages(n)]


def _writer(design: str, path: str, worker: int, begin: float, seconds: float, barrier, results) -> None:
    """Append from ``begin`` for ``seconds`` (perf_counter is the system's monotonic clock, the same in every
    process); counts the appends that finished inside that window, so every design and writer count is
    measured over the same window, without process start-up or tear-down."""
    store = STORES[design](Path(path))
    session_id = f"w{worker}"
    texts = _texts(worker)
    latencies: list[float] = []
    errors = 0
    stored = in_window = 0
    barrier.wait()
    while time.perf_counter() < begin:
        time.sleep(0.0005)
    end = begin + seconds
    i = 0
    while True:
        start = time.perf_counter()
        if start >= end:
            break
        role, content = texts[i % len(texts)]
        i += 1
        try:
            store.append_message(session_id, role, content)
            stored += 1
        except Exception:  # noqa: BLE001 - any failure surfaced to the caller counts
            errors += 1
        finished = time.perf_counter()
        in_window += finished <= end
        latencies.append(finished - start)
    store.close()
    results.put((worker, stored, errors, latencies, in_window))


def run(design: str, writers: int, seconds: float, workdir: Path, round_no: int) -> dict:
    """One timed run in a fresh database: raw counts and latencies."""
    path = workdir / f"{design}-{writers}-{round_no}.db"
    STORES[design].create(path)
    setup = STORES[design](path)
    for w in range(writers):
        setup.sessions.create(f"w{w}", "bench")
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(writers + 1)
    results = ctx.Queue()
    begin = time.perf_counter() + 0.5 + 0.05 * writers  # after every writer has started and opened the store
    procs = [ctx.Process(target=_writer, args=(design, str(path), w, begin, seconds, barrier, results))
             for w in range(writers)]
    for p in procs:
        p.start()
    barrier.wait()
    outcomes = [results.get() for _ in procs]
    for p in procs:
        p.join()
    lost = sum(max(0, o[1] - setup.count(f"w{o[0]}")) for o in outcomes)
    setup.close()
    return {"stored": sum(o[1] for o in outcomes), "errors": sum(o[2] for o in outcomes), "lost": lost,
            "in_window": sum(o[4] for o in outcomes), "seconds": seconds,
            "latencies": [x for o in outcomes for x in o[3]]}


def summarize(runs: list[dict]) -> dict:
    """Pool the rounds: total messages over total time, percentiles over every write."""
    lat = sorted(x for r in runs for x in r["latencies"])
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    return {
        "rate": sum(r["in_window"] for r in runs) / sum(r["seconds"] for r in runs),
        "p50": q[49] * 1000, "p99": q[98] * 1000, "max": lat[-1] * 1000,
        "errors": sum(r["errors"] for r in runs), "lost": sum(r["lost"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per configuration, interleaved with the others so load changes hit all alike")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--designs", nargs="+", default=["seed", "ours"], choices=list(STORES))
    args = parser.parse_args()
    print(f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, {mp.cpu_count()} CPUs "
          f"(load average {os.getloadavg()[0]:.1f} before); {args.rounds} rounds of {args.seconds:g} s per "
          "configuration; one message per transaction")
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as tmp:
        for round_no in range(args.rounds):
            for writers in args.writers:
                for design in args.designs:
                    runs.setdefault((design, writers), []).append(run(design, writers, args.seconds, Path(tmp), round_no))
                    for suffix in ("", "-wal", "-shm", "-lock"):
                        Path(tmp, f"{design}-{writers}-{round_no}.db{suffix}").unlink(missing_ok=True)
    print(f"{'design':<6} {'writers':>7} {'msg/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'errors':>6} {'lost':>5} "
          f"{'vs 1 writer':>11}")
    for writers in args.writers:
        for design in args.designs:
            r = summarize(runs[(design, writers)])
            single = summarize(runs[(design, 1)])["rate"] if (design, 1) in runs else None
            share = f"{r['rate'] / single * 100:.0f} %" if single else "-"
            print(f"{design:<6} {writers:>7} {r['rate']:>8.0f} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['max']:>7.1f} "
                  f"{r['errors']:>6} {r['lost']:>5} {share:>11}")
    print(f"load average {os.getloadavg()[0]:.1f} after (other processes on this machine share its CPUs)")


if __name__ == "__main__":
    main()
