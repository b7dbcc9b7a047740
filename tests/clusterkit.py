"""Instances of a cluster as real processes, for tests/test_cluster_*.py and bench/cluster_failover.py.

    python -m tests.clusterkit owner --key telegram:abc --name A --events /tmp/a.log [--failover 10] [--once]
    python -m tests.clusterkit lease-writer --session s1 --holder A --lease 1.5

Both read the database URL from ``SWITCHBOARD_TEST_PG_URL`` (never from the
command line, where ``ps`` would show its password).

``owner`` stands by for the key, then acts as the holder of a platform
connection: before each "request" it calls ``owner.check()`` and writes a
``poll`` line with the wall time at which the check passed; when ownership is
lost it writes ``lost`` and stands by again (or exits, with ``--once``).
Every line of the events file is ``<time.time()> <event> [detail]``.

``lease-writer`` claims a session's lease, prints ``claimed <token>``, waits for
a line on stdin (the turn's work), then stores one row of ``turn_writes`` in a
transaction guarded by ``fenced_write`` and prints ``wrote`` or
``refused <LeaseLost message>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

TURN_WRITES = "CREATE TABLE IF NOT EXISTS turn_writes (session_id TEXT NOT NULL, token BIGINT NOT NULL, holder TEXT NOT NULL)"


def _url() -> str:
    try:
        return os.environ["SWITCHBOARD_TEST_PG_URL"]
    except KeyError:
        raise SystemExit("set SWITCHBOARD_TEST_PG_URL to the database URL") from None


def child_command(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.clusterkit", role, *args]


def child_env(url: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "SWITCHBOARD_TEST_PG_URL": url, "PYTHONPATH": root}


def read_events(path: Path) -> list[tuple[float, str, str]]:
    """The events an ``owner`` wrote so far: (wall time, event, detail)."""
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            when, _, rest = line.partition(" ")
            event, _, detail = rest.partition(" ")
            events.append((float(when), event, detail))
    return events


async def _owner(args: argparse.Namespace) -> None:
    from state.cluster import ConnectionOwner, OwnershipLost

    out = open(args.events, "a", buffering=1)  # one line at a time: a SIGKILL loses nothing written

    def write(event: str, detail: str = "") -> None:
        out.write(f"{time.time():.6f} {event} {detail}".rstrip() + "\n")

    owner = ConnectionOwner(_url(), args.key, failover_seconds=args.failover, instance=args.name)
    while True:
        write("standby")
        await owner.acquire()
        write("owned")
        while True:
            try:
                owner.check()
            except OwnershipLost as exc:
                write("lost", exc.reason)
                break
            write("poll")  # the request this check allowed
            await asyncio.sleep(args.poll_every)
        if args.once:
            return


def _lease_writer(args: argparse.Namespace) -> None:
    import psycopg

    from state.cluster import LeaseLost, claim, fenced_write

    with psycopg.connect(_url(), autocommit=True, application_name=f"lease-writer {args.holder}") as conn:
        lease = claim(conn, args.session, args.holder, args.lease)
        if lease is None:
            print("busy", flush=True)
            return
        print(f"claimed {lease.token}", flush=True)
        sys.stdin.readline()  # the turn's work: the test pauses this process here
        try:
            with conn.transaction():
                fenced_write(conn, lease.session_id, lease.token)
                conn.execute("INSERT INTO turn_writes (session_id, token, holder) VALUES (%s, %s, %s)",
                             (lease.session_id, lease.token, args.holder))
        except LeaseLost as exc:
            print(f"refused {exc}", flush=True)
        else:
            print("wrote", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.clusterkit")
    roles = parser.add_subparsers(dest="role", required=True)
    owner = roles.add_parser("owner")
    owner.add_argument("--key", required=True)
    owner.add_argument("--name", required=True)
    owner.add_argument("--events", required=True)
    owner.add_argument("--failover", type=float, default=10.0)
    owner.add_argument("--poll-every", type=float, default=0.05)
    owner.add_argument("--once", action="store_true")
    writer = roles.add_parser("lease-writer")
    writer.add_argument("--session", required=True)
    writer.add_argument("--holder", required=True)
    writer.add_argument("--lease", type=float, required=True)
    args = parser.parse_args()
    if args.role == "owner":
        asyncio.run(_owner(args))
    else:
        _lease_writer(args)


if __name__ == "__main__":
    main()
