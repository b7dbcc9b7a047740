"""Append rate and file size: the two-copy store (``seed``, see bench/README.md) beside ours.

    .venv/bin/python bench/write.py                    # 1,000,000 messages, 5,000 appends
    .venv/bin/python bench/write.py --messages 50000   # a quick run
    .venv/bin/python bench/write.py --pg               # and PostgreSQL (a throw-away cluster; or --url URL)

For each design: a database of ``--messages`` corpus messages (about 10 %
Chinese; built once into ``bench/.data/`` and reused), then ``--appends``
single-message transactions (``BEGIN IMMEDIATE``, insert the message, bump the
session's counter, ``COMMIT``; WAL, ``synchronous=NORMAL``) timed one by one.
The appended rows are deleted afterwards so the next run starts from the same
database.  Prints messages/s, p50/p99 append latency and file size per
million messages, with where the bytes go.  When ``state.SessionDB`` exists,
the same appends through ``db.messages.append`` are measured too.

With ``--url`` or ``--pg`` (``bench._pg``), the same appends go to a PostgreSQL database of
the same messages: as plain transactions (insert, bump the counter, commit) and through
``db.messages.append`` (a serializable transaction from the pool), with the
database's size per million messages.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _pg, _stores
from bench._corpus import Corpus

MB = 1024 * 1024


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Appender:
    """Single-message transactions into one design's database, timed one by one."""

    def __init__(self, path: Path, appends: int):
        self.conn = _stores.connect(path)
        self.base = self.conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        self.corpus = Corpus(seed=7, start=1_800_000_000.0)
        self.rows = list(self.corpus.messages(appends))
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(
            "INSERT INTO sessions (id, source, model, started_at) VALUES (?, ?, ?, ?)",
            [(s.id, s.source, s.model, s.started_at) for s in self.corpus.sessions],
        )
        self.conn.execute("COMMIT")
        self.lat: list[float] = []
        self.elapsed = 0.0

    def run(self, start: int, stop: int) -> None:
        conn = self.conn
        t0 = time.perf_counter()
        for row in self.rows[start:stop]:
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO messages (session_id, role, content, tool_calls, tool_name, timestamp)"
                " VALUES (?,?,?,?,?,?)",
                row,
            )
            conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = ?", (row[0],))
            conn.execute("COMMIT")
            self.lat.append(time.perf_counter() - t)
        self.elapsed += time.perf_counter() - t0

    def result(self) -> dict:
        _cleanup(self.conn, self.base, self.corpus)
        self.conn.close()
        return {"rate": len(self.lat) / self.elapsed, "p50": _pct(self.lat, 0.5), "p99": _pct(self.lat, 0.99)}


def measure_appends(paths: dict[str, Path], appends: int, rounds: int) -> dict[str, dict]:
    """Appends in ``rounds`` alternating slices, so both designs see the same machine load."""
    appenders = {d: Appender(p, appends) for d, p in paths.items()}
    step = -(-appends // rounds)
    for start in range(0, appends, step):
        for a in appenders.values():
            a.run(start, min(appends, start + step))
    return {d: a.result() for d, a in appenders.items()}


def _cleanup(conn, base: int, corpus: Corpus) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM messages WHERE id > ?", (base,))
    conn.executemany("DELETE FROM sessions WHERE id = ?", [(s.id,) for s in corpus.sessions])
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def measure_sessiondb(path: Path, appends: int) -> dict | None:
    try:
        from state import SessionDB
    except ImportError:
        return None
    db = SessionDB(path)
    conn = _stores.connect(path)
    base = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
    corpus = Corpus(seed=7, start=1_800_000_000.0)
    rows = list(corpus.messages(appends))
    import json

    for s in corpus.sessions:
        db.sessions.create(session_id=s.id, source=s.source, model=s.model)
    lat = []
    t0 = time.perf_counter()
    for sid, role, content, tool_calls, tool_name, _ts in rows:
        t = time.perf_counter()
        db.messages.append(sid, role=role, content=content,
                          tool_calls=json.loads(tool_calls) if tool_calls else None, tool_name=tool_name)
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    db.close()
    _cleanup(conn, base, corpus)
    conn.close()
    return {"rate": appends / elapsed, "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99)}


def measure_pg(url: str, appends: int) -> tuple[dict, dict]:
    """Plain single-message transactions, then ``db.messages.append``, on PostgreSQL."""
    import json

    import psycopg

    from state import SessionDB

    corpus = Corpus(seed=7, start=1_800_000_000.0)
    rows = list(corpus.messages(appends))
    with psycopg.connect(url) as conn:
        base = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        with conn.cursor().copy("COPY sessions (id, source, model, started_at) FROM STDIN") as copy:
            for sess in corpus.sessions:
                copy.write_row((sess.id, sess.source, sess.model, sess.started_at))
        conn.commit()
        lat = []
        t0 = time.perf_counter()
        for row in rows[: appends // 2]:
            t = time.perf_counter()
            conn.execute("INSERT INTO messages (session_id, role, content, tool_calls, tool_name, timestamp)"
                         " VALUES (%s, %s, %s, %s, %s, %s)", row)
            conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = %s", (row[0],))
            conn.commit()
            lat.append(time.perf_counter() - t)
        plain = {"rate": len(lat) / (time.perf_counter() - t0), "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99)}
    db = SessionDB(url)
    lat = []
    t0 = time.perf_counter()
    for sid, role, content, tool_calls, tool_name, _ts in rows[appends // 2:]:
        t = time.perf_counter()
        db.messages.append(sid, role=role, content=content,
                          tool_calls=json.loads(tool_calls) if tool_calls else None, tool_name=tool_name)
        lat.append(time.perf_counter() - t)
    through = {"rate": len(lat) / (time.perf_counter() - t0), "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99)}
    db.close()
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM messages WHERE id > %s", (base,))
        conn.execute("DELETE FROM sessions WHERE id = ANY(%s)", ([sess.id for sess in corpus.sessions],))
    return plain, through


def report_pg(server: str, n: int, appends: int) -> None:
    url = _pg.build(server, n)
    per_m = 1_000_000 / n
    parts = _pg.breakdown(url)
    plain, through = measure_pg(url, appends)
    print(f"\nPostgreSQL ({n:,} messages, {appends // 2:,} appends each way):")
    print(f"  plain transactions (insert, bump the counter, commit): {plain['rate']:,.0f} msgs/s, "
          f"p50 {plain['p50'] * 1000:.2f} ms, p99 {plain['p99'] * 1000:.2f} ms")
    print(f"  through db.messages.append: {through['rate']:,.0f} msgs/s, "
          f"p50 {through['p50'] * 1000:.2f} ms, p99 {through['p99'] * 1000:.2f} ms")
    print(f"  size: {sum(parts.values()) * per_m / MB:,.0f} MB per 1M messages")
    for key, size in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"    {key:28} {size * per_m / MB:9,.0f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000, help="size of the database appended to")
    ap.add_argument("--appends", type=int, default=5_000, help="single-message transactions to time")
    ap.add_argument("--rounds", type=int, default=10, help="alternate the designs this many times")
    ap.add_argument("--only-pg", action="store_true", help="skip the SQLite designs (with --url or --pg)")
    _pg.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.only_pg:
        with _pg.server(args) as server:
            if server is None:
                ap.error("--only-pg needs --url or --pg")
            report_pg(server, args.messages, args.appends)
        return

    print(f"Appending {args.appends:,} messages, one per transaction, into {args.messages:,} messages "
          f"(WAL, synchronous=NORMAL)")
    sizes, parts, paths = {}, {}, {}
    for design in _stores.DESIGNS:
        paths[design] = path = _stores.build(design, args.messages)
        sizes[design] = _stores.db_size(path)
        conn = _stores.connect(path)
        parts[design] = _stores.breakdown(conn)
        conn.close()
    results = measure_appends(paths, args.appends, args.rounds)
    per_m = 1_000_000 / args.messages
    print()
    print(f"{'design':10} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'MB per 1M msgs':>15}")
    for design in _stores.DESIGNS:
        r = results[design]
        print(f"{design:10} {r['rate']:9,.0f} {r['p50'] * 1000:8.2f} {r['p99'] * 1000:8.2f} "
              f"{sizes[design] * per_m / MB:15,.0f}")
    seed, ours = results["seed"], results["ours"]
    print(f"\nours / seed: append rate x{ours['rate'] / seed['rate']:.2f} (target >= 2.5), "
          f"file size x{sizes['ours'] / sizes['seed']:.2f} (target <= 0.5)")
    for design in _stores.DESIGNS:
        print(f"\n{design}: where the bytes go (MB per 1M messages)")
        for key, size in sorted(parts[design].items(), key=lambda kv: -kv[1]):
            print(f"  {key:28} {size * per_m / MB:9,.0f}")
    sdb = measure_sessiondb(_stores.path_for("ours", args.messages), args.appends)
    if sdb:
        print(f"\nours through db.messages.append: {sdb['rate']:,.0f} msgs/s, "
              f"p50 {sdb['p50'] * 1000:.2f} ms, p99 {sdb['p99'] * 1000:.2f} ms")
    with _pg.server(args) as server:
        if server is not None:
            report_pg(server, args.messages, args.appends)


if __name__ == "__main__":
    main()
