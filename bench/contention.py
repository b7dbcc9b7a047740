"""Write contention: 1, 4 and 8 writer processes appending messages, the two-copy store (``seed``, see bench/README.md) beside ours.

    .venv/bin/python bench/contention.py                  # 1, 4, 8 writers; 3 rounds of 2 s each
    .venv/bin/python bench/contention.py --seconds 1 --rounds 1 --writers 1 8

Each writer process appends single messages (one transaction each) to its own
session as fast as it can for ``--seconds``, timing every append; all writers
start at the same instant.  Prints the aggregate messages/s (appends finished
inside that window of ``--seconds``, per second), p50/p99/max write latency, errors surfaced to the caller
(a failed append is a lost message), rows lost (appends reported as stored
but missing from the database afterwards) and ``fewest``: in the round where it was worst, the
appends of the writer that made the fewest, as a share of the writers' average (100 % is fair).

* ``seed``: the original design's contention handling: a 1 s SQLite busy timeout, then up
  to 15 application retries sleeping 20-150 ms at random, ``BEGIN IMMEDIATE``,
  a PASSIVE checkpoint every 50 writes; over the seed's tables with both FTS5
  tables (unicode61 and trigram over every message), ``synchronous=NORMAL``.
* ``ours``: ``db.messages.append`` (SQLite's lock, no busy timeout, a retry every 0.5-1.5 ms; a
  writer that has found the lock held 8 times raises a flag that holds the others back until it is
  in, ``state._lock``; patience 10 s measured in time; the search design of ``state.search.fts5``).
* ``retry``: ours without that flag, to show what it is for.

``--load product`` runs the product's own load instead: one daemon (turns of 20 chats), a CLI
command every 50 ms (a process of its own opening the store for one rename) and cron (a run every
100 ms), each write timed by its kind; lost counts the messages and titles reported as stored but
missing afterwards.

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


class RetryStore(OurStore):
    """Ours without the starving writer's flag (``state._lock``): SQLite's lock and the engine's
    jittered retries alone (``Engine._begin_immediate``), to show what the flag is for."""

    def __init__(self, path: Path):
        super().__init__(path)
        engine = self.db._engine
        engine._flag.close()  # type: ignore[union-attr]  # bench-only switch
        engine._flag = None  # type: ignore[union-attr]


STORES = {"seed": SeedStore, "ours": OurStore, "retry": RetryStore}


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
    barrier.wait()  # every writer has opened its store
    barrier.wait()  # and the start is set
    begin = begin.value
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
        setup.create_session(f"w{w}", "bench")
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(writers + 1)
    results = ctx.Queue()
    begin = ctx.Value("d", 0.0)  # set once every writer has opened its store (seconds on a busy machine)
    procs = [ctx.Process(target=_writer, args=(design, str(path), w, begin, seconds, barrier, results))
             for w in range(writers)]
    for p in procs:
        p.start()
    barrier.wait()
    begin.value = time.perf_counter() + 0.05
    barrier.wait()
    outcomes = [results.get() for _ in procs]
    for p in procs:
        p.join()
    lost = sum(max(0, o[1] - setup.count(f"w{o[0]}")) for o in outcomes)
    setup.close()
    return {"stored": sum(o[1] for o in outcomes), "errors": sum(o[2] for o in outcomes), "lost": lost,
            "in_window": sum(o[4] for o in outcomes), "seconds": seconds,
            "fewest": min(o[4] for o in outcomes) / (sum(o[4] for o in outcomes) / writers or 1),
            "latencies": [x for o in outcomes for x in o[3]]}


def summarize(runs: list[dict]) -> dict:
    """Pool the rounds: total messages over total time, percentiles over every write."""
    lat = sorted(x for r in runs for x in r["latencies"])
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [lat[0]] * 99
    return {
        "rate": sum(r["in_window"] for r in runs) / sum(r["seconds"] for r in runs),
        "p50": q[49] * 1000, "p99": q[98] * 1000, "max": lat[-1] * 1000,
        "errors": sum(r["errors"] for r in runs), "lost": sum(r["lost"] for r in runs),
        "fewest": min(r.get("fewest", 1.0) for r in runs),
    }


# -- the product's own load: one daemon, CLI commands, cron -------------------------------------------


def _cli_command(design: str, path: str, n: int, done) -> None:
    """One CLI command: open the store, rename a chat's session, close; the seconds it took, failed or not."""
    start = time.perf_counter()
    try:
        store = STORES[design](Path(path))
        store.db.titles.set(f"chat{n % 20}", f"renamed {n}")
        store.close()
        done.put((time.perf_counter() - start, 0))
    except Exception:  # noqa: BLE001 - any failure surfaced to the caller counts
        done.put((time.perf_counter() - start, 1))


def _product_role(design: str, path: str, role: str, begin: float, seconds: float, barrier, results) -> None:
    """One process of the product's load, timing each of its writes (see :func:`product`); also says
    what it stored (messages per session; the last title it gave each chat) for the count of lost writes."""
    latencies: list[float] = []
    messages: dict[str, int] = {}
    titles: dict[str, str] = {}
    errors = stored = 0
    texts = _texts(hash(role) % 100, 200)
    barrier.wait()
    while time.perf_counter() < begin:
        time.sleep(0.0005)
    end = begin + seconds
    i = 0

    def timed(op, *args, **kwargs):
        nonlocal errors, stored
        start = time.perf_counter()
        result = None
        try:
            result = op(*args, **kwargs)
            stored += 1
        except Exception:  # noqa: BLE001 - any failure surfaced to the caller counts
            errors += 1
        latencies.append(time.perf_counter() - start)
        return result

    if role == "daemon":  # turns of 20 chats, each an inbound message and a recorded reply
        store = STORES[design](Path(path))
        while time.perf_counter() < end:
            chat = f"chat{i % 20}"
            content = texts[i % len(texts)][1]
            got = timed(store.db.messages.append_inbound, chat, content, platform_message_id=f"p{i}")
            stored_before = stored
            timed(store.db.messages.record_turn, chat, [{"role": "assistant", "content": content}],
                  input_tokens=100, output_tokens=20, answered=[got.id] if got else [])
            messages[chat] = messages.get(chat, 0) + (got is not None) + (stored - stored_before)
            i += 1
            time.sleep(0.005)  # the model's answer, the platform's round trips: ~100 turns/s at most
        store.close()
    elif role == "cli":  # a command every 50 ms, each a process of its own opening the store for one write
        ctx = mp.get_context("fork")
        while time.perf_counter() < end:
            done = ctx.Queue()
            proc = ctx.Process(target=_cli_command, args=(design, path, i, done))
            proc.start()
            took, failed = done.get()
            proc.join()
            latencies.append(took)
            errors += failed
            stored += 1 - failed
            if not failed:
                titles[f"chat{i % 20}"] = f"renamed {i}"
            i += 1
            time.sleep(0.05)
    else:  # cron: a job's run begun and finished every 100 ms, its answer stored in its own session
        store = STORES[design](Path(path))
        store.db.cron.add_job({"id": "job", "name": "digest", "schedule": "every 1m", "prompt": "digest",
                               "deliver": "local", "model": None, "context": "fresh", "grace_seconds": 60.0}, source="cli",
                              now=time.time(), next_run_at=None)
        while time.perf_counter() < end:
            run = timed(store.db.cron.begin_run, "job", holder="bench", now=time.time(), lease_seconds=60,
                        trigger="schedule", scheduled_at=None, deliver=None)
            stored_before = stored
            timed(store.db.messages.append, "cron", "assistant", texts[i % len(texts)][1])
            messages["cron"] = messages.get("cron", 0) + (stored - stored_before)
            if run and run["status"] == "running":
                timed(store.db.cron.finish_run, run["run"]["id"], holder="bench", now=time.time(), status="ok")
            i += 1
            time.sleep(0.1)
        store.close()
    results.put((role, stored, errors, latencies, messages, titles))


def product(design: str, seconds: float, workdir: Path, round_no: int) -> dict[str, dict]:
    """One daemon, a CLI command every 50 ms and cron, for ``seconds``: each role's write latencies."""
    path = workdir / f"product-{design}-{round_no}.db"
    STORES[design].create(path)
    setup = STORES[design](path)
    for n in range(20):
        setup.create_session(f"chat{n}", "bench")
    setup.create_session("cron", "cron")
    ctx = mp.get_context("fork")
    roles = ("daemon", "cli", "cron")
    barrier = ctx.Barrier(len(roles) + 1)
    results = ctx.Queue()
    begin = time.perf_counter() + 2.0  # after every role has started and opened the store
    procs = [ctx.Process(target=_product_role, args=(design, str(path), role, begin, seconds, barrier, results))
             for role in roles]
    for proc in procs:
        proc.start()
    barrier.wait()
    outcomes = {o[0]: o for o in (results.get() for _ in procs)}
    for proc in procs:
        proc.join()
    lost = {role: sum(max(0, n - setup.count(session)) for session, n in o[4].items())
            + sum(setup.db.titles.get(chat) != title for chat, title in o[5].items())
            for role, o in outcomes.items()}
    setup.close()
    return {role: {"stored": o[1], "errors": o[2], "lost": lost[role], "in_window": o[1], "seconds": seconds,
                   "latencies": o[3]} for role, o in outcomes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per configuration, interleaved with the others so load changes hit all alike")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--designs", nargs="+", default=["seed", "ours"], choices=list(STORES))
    parser.add_argument("--load", choices=["flat-out", "product"], default="flat-out",
                        help="flat-out: --writers processes appending as fast as they can; product: one daemon "
                             "(turns of 20 chats), a CLI command every 50 ms (a process opening the store for one "
                             "write) and cron (a run every 100 ms)")
    args = parser.parse_args()
    if args.load == "product":
        main_product(args)
        return
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
          f"{'vs 1 writer':>11} {'fewest':>6}")
    for writers in args.writers:
        for design in args.designs:
            r = summarize(runs[(design, writers)])
            single = summarize(runs[(design, 1)])["rate"] if (design, 1) in runs else None
            share = f"{r['rate'] / single * 100:.0f} %" if single else "-"
            print(f"{design:<6} {writers:>7} {r['rate']:>8.0f} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['max']:>7.1f} "
                  f"{r['errors']:>6} {r['lost']:>5} {share:>11} {r['fewest'] * 100:>5.0f}%")
    print(f"load average {os.getloadavg()[0]:.1f} after (other processes on this machine share its CPUs)")


def main_product(args: argparse.Namespace) -> None:
    designs = [d for d in args.designs if d != "seed"]  # the seed's store has no turns, cron or titles
    print(f"SQLite {sqlite3.sqlite_version}, {mp.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} before); "
          f"the product's load: one daemon, CLI commands, cron; {args.rounds} rounds of {args.seconds:g} s; "
          "latency of each write (CLI: of each command, opening the store included)")
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as tmp:
        for round_no in range(args.rounds):
            for design in designs:
                for role, run_ in product(design, args.seconds, Path(tmp), round_no).items():
                    runs.setdefault((design, role), []).append(run_)
    print(f"{'design':<6} {'role':<7} {'writes':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'errors':>6} {'lost':>5}")
    for role in ("daemon", "cli", "cron"):
        for design in designs:
            if not any(x["latencies"] for x in runs[(design, role)]):
                print(f"{design:<6} {role:<7} no write finished in the window")
                continue
            r = summarize(runs[(design, role)])
            writes = sum(x["stored"] for x in runs[(design, role)])
            print(f"{design:<6} {role:<7} {writes:>7} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['max']:>7.1f} {r['errors']:>6} "
                  f"{r['lost']:>5}")
    print(f"load average {os.getloadavg()[0]:.1f} after (other processes on this machine share its CPUs)")


if __name__ == "__main__":
    main()
