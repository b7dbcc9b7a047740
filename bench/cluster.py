"""Aggregate turns per second with 1, 2 and 3 instances on one PostgreSQL store.

Real ``switchboard run`` daemons (tests/crashkit.py's ``Daemon``, configured as
tests/clusterdaemons.py does: one ``store.url``, the configs differing only in the
API port and the instance's name) on a throw-away PostgreSQL (tests/pgserver.py),
the fake Telegram in long-polling mode (in this process) and the fake model (a
process of its own, answering after --delay).  For each number of instances a
fresh database: the instances start, then --chats users each write a DM, wait
until the bot's whole answer to it shows, and write the next, until --messages DMs
are answered (one DM per chat first, to warm up, is not counted).

``--via api`` sends the same messages through the local OpenAI-style API instead,
each chat a session of its own on instance ``chat % instances``: no platform and
no platform's rate limits, so what the machine and the database can do shows.

Printed per number of instances:

* turns/s: messages answered in the measured window, per second;
* latency p50/p95: from a message sent to the bot's reply first shown (Telegram: the
  fake accepting its sendMessage, a streamed reply being edited to its end later;
  the API: the response);
* CPU, as a % of one core over the window: each daemon, PostgreSQL (every process
  of the server), the fake model, this process (the fake Telegram and the users),
  and the whole machine (both cores, other users of the machine included);
* the load average at the end, PostgreSQL commits and rollbacks (retried conflicts) per turn
  (``pg_stat_database``'s ``xact_commit`` and ``xact_rollback`` over the window; the sampler runs its
  queries from the server's ``postgres`` database, so its own transactions are not counted), round trips per
  turn (``pg_stat_statements``' calls over the window, ``BEGIN`` and ``COMMIT`` included, the
  sampler's own queries left out; the server is started with the module preloaded, the
  extension created in its ``postgres`` database), and its backends as sampled every 0.1 s:
  active on average, waiting on a lock (heavyweight ``Lock``, or ``LWLock``) on average.

No timed assertion: the figures are for reading.

    .venv/bin/python bench/cluster.py [--messages 600] [--chats 60] [--delay 0.2] [--instances 1 2 3]
                                      [--via telegram|api] [--no-stream] [--durable] [--statements N]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp
import psycopg
import yaml

from tests.clusterdaemons import instance_dir, instance_settings
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import start_in_process as start_model
from tests.fakes.telegram import FakeTelegram, SentMessage
from tests.pgserver import PgCluster, why_unavailable

_ECHO = re.compile(r"echo: (.*?) \| turns: ")
ANSWER_TIMEOUT = 120.0
_TICKS = os.sysconf("SC_CLK_TCK")


# -- CPU from /proc ---------------------------------------------------------------------------


def _cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """utime + stime of ``pid`` (and of its children it reaped), in seconds; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICKS


def _threads(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (its thread id == ``pid`` is the main thread: the event loop)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    return out


def _children(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    out.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    return out


def _postgres_seconds(postmaster: int) -> float:
    """CPU of the whole server: the postmaster, the backends it reaped, and the ones alive."""
    return _cpu_seconds(postmaster, reaped_children=True) + sum(_cpu_seconds(p) for p in _children(postmaster))


def _machine() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / _TICKS, sum(values) / _TICKS


@dataclass
class CpuMeter:
    """CPU seconds of the processes of one run, between :meth:`start` and :meth:`stop`."""

    daemons: list[int]
    postmaster: int
    model: int
    begun: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    threads_begun: dict[int, dict[int, float]] = field(default_factory=dict)
    threads_used: dict[int, dict[int, float]] = field(default_factory=dict)  # daemon pid -> thread id -> seconds

    def _read(self) -> dict[str, float]:
        busy, total = _machine()
        now = {f"instance {n + 1}": _cpu_seconds(pid) for n, pid in enumerate(self.daemons)}
        now.update({"postgres": _postgres_seconds(self.postmaster), "model": _cpu_seconds(self.model),
                    "bench": _cpu_seconds(os.getpid()), "machine busy": busy, "machine total": total})
        return now

    def start(self) -> None:
        self.begun = self._read()
        self.threads_begun = {pid: _threads(pid) for pid in self.daemons}

    def stop(self) -> None:
        end = self._read()
        self.used = {name: end[name] - self.begun[name] for name in end}
        for pid in self.daemons:
            before = self.threads_begun[pid]
            self.threads_used[pid] = {tid: t - before.get(tid, 0.0) for tid, t in _threads(pid).items()}

    def threads(self, n: int) -> tuple[float, list[float]]:
        """Instance ``n``'s event loop thread and its other threads, busiest first: CPU seconds each."""
        pid = self.daemons[n]
        used = dict(self.threads_used[pid])
        loop = used.pop(pid, 0.0)
        return loop, sorted(used.values(), reverse=True)


# -- PostgreSQL's side --------------------------------------------------------------------------


@dataclass
class DbSampler:
    """pg_stat_activity of the database every 0.1 s, and its commits, while the load runs."""

    url: str
    admin_url: str  # the server's ``postgres`` database, where pg_stat_statements is created
    samples: int = 0
    active: int = 0
    in_transaction: int = 0  # active, or idle in a transaction: waiting for its client
    on_lock: int = 0
    on_lwlock: int = 0
    commits: int = 0
    rollbacks: int = 0  # serialization failures and deadlocks retried, mostly
    round_trips: int | None = None  # statements the daemons ran (pg_stat_statements), None when unavailable
    statements: dict[str, int] = field(default_factory=dict)  # each statement's text -> times it ran in the window

    @property
    def _database(self) -> str:
        return self.url.rsplit("/", 1)[1]

    async def run(self, stop: asyncio.Event) -> None:
        # every query of the sampler's runs in the server's ``postgres`` database: its own transactions
        # (one per sample, autocommitted) are not counted among the bench database's commits
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as admin:
            first, first_rollbacks = await self._commits(admin), await self._rollbacks(admin)
            first_calls, first_each = await self._calls(admin), await self._each(admin)
            while not stop.is_set():
                cur = await admin.execute(
                    "SELECT state, wait_event_type FROM pg_stat_activity WHERE datname = %s", (self._database,))
                for state, wait in await cur.fetchall():
                    self.in_transaction += state in ("active", "idle in transaction")
                    if state == "active":
                        self.active += 1
                        self.on_lock += wait == "Lock"
                        self.on_lwlock += wait == "LWLock"
                self.samples += 1
                try:
                    await asyncio.wait_for(stop.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
            self.commits = await self._commits(admin) - first
            self.rollbacks = await self._rollbacks(admin) - first_rollbacks
            calls = await self._calls(admin)
            self.round_trips = None if calls is None or first_calls is None else calls - first_calls
            for query, count in (await self._each(admin)).items():
                if count > first_each.get(query, 0):
                    self.statements[query] = count - first_each.get(query, 0)

    async def _each(self, admin: psycopg.AsyncConnection) -> dict[str, int]:
        """Calls so far of each statement in the bench's database (the sampler's own left out)."""
        try:
            cur = await admin.execute(
                "SELECT query, sum(calls) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND query NOT LIKE %s GROUP BY query",
                (self._database, "%pg_stat_%"))
        except psycopg.Error:
            return {}
        return {query: int(calls) for query, calls in await cur.fetchall()}

    async def _calls(self, admin: psycopg.AsyncConnection) -> int | None:
        """Statements run so far in the bench's database, this sampler's own left out (None: no extension)."""
        try:
            cur = await admin.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND query NOT LIKE %s",
                (self._database, "%pg_stat_%"))
        except psycopg.Error:
            return None
        return int((await cur.fetchone())[0])

    async def _commits(self, admin: psycopg.AsyncConnection) -> int:
        cur = await admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (self._database,))
        return (await cur.fetchone())[0]

    async def _rollbacks(self, admin: psycopg.AsyncConnection) -> int:
        cur = await admin.execute("SELECT xact_rollback FROM pg_stat_database WHERE datname = %s", (self._database,))
        return (await cur.fetchone())[0]


# -- the users ---------------------------------------------------------------------------------


class Users:
    """Chats that each write a message, wait for the whole answer, and write the next."""

    def __init__(self, chats: int):
        self.chats = chats

    async def ask(self, index: int, text: str) -> float:
        """Write ``text`` from chat ``index``; the seconds until the answer to it was first shown."""
        raise NotImplementedError

    async def warm_up(self) -> None:
        """One message from every chat, so each has its session before anything is measured."""
        await asyncio.gather(*(self.ask(index, f"c{index:03d} hello") for index in range(self.chats)))

    async def round(self, total: int) -> tuple[list[float], float]:
        """``total`` messages from all chats, each chat one at a time: the latencies and the seconds it took."""
        tickets = iter(range(total))
        latencies: list[float] = []

        async def chat(index: int) -> None:
            for n in tickets:
                latencies.append(await self.ask(index, f"c{index:03d} m{n:05d}"))

        began = time.monotonic()
        await asyncio.gather(*(chat(i) for i in range(self.chats)))
        return latencies, time.monotonic() - began


class TelegramUsers(Users):
    """DMs through the fake Telegram; an answer shows when the fake accepts the bot's sendMessage."""

    def __init__(self, tg: FakeTelegram, chats: int):
        super().__init__(chats)
        self.side = TelegramSide(tg)
        self._waiting: dict[str, asyncio.Future] = {}  # DM text -> when the reply to it was first shown
        self._first_shown: dict[int, float] = {}  # message id -> when the fake accepted its sendMessage
        tg.on_shown = self._shown

    def _shown(self, message: SentMessage) -> None:
        self._first_shown.setdefault(message.message_id, message.at)
        found = _ECHO.search(message.visible_text)
        if found and found.group(1) in self._waiting:
            done = self._waiting.pop(found.group(1))
            if not done.done():
                done.set_result(self._first_shown[message.message_id])

    async def ask(self, index: int, text: str) -> float:
        done = asyncio.get_running_loop().create_future()
        sent = time.monotonic()
        self._waiting[text] = done
        await self.side.send(index, text)
        return await asyncio.wait_for(done, ANSWER_TIMEOUT) - sent


class ApiUsers(Users):
    """Sessions of the local OpenAI-style API, chat ``n`` always on instance ``n % instances``."""

    def __init__(self, http: aiohttp.ClientSession, ports: list[int], chats: int):
        super().__init__(chats)
        self.http = http
        self.ports = ports

    async def ask(self, index: int, text: str) -> float:
        port = self.ports[index % len(self.ports)]
        sent = time.monotonic()
        async with self.http.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                  json={"model": "switchboard", "messages": [{"role": "user", "content": text}]},
                                  headers={"X-Session-Key": f"bench:{index}"},
                                  timeout=aiohttp.ClientTimeout(total=ANSWER_TIMEOUT)) as response:
            body = await response.json()
        answer = body["choices"][0]["message"]["content"] if response.status == 200 else str(body)
        if f"echo: {text} |" not in answer:
            raise RuntimeError(f"chat {index} got {answer!r} for {text!r}")
        return time.monotonic() - sent


# -- one run -------------------------------------------------------------------------------------


@dataclass
class Row:
    instances: int
    turns: int
    seconds: float
    latencies: list[float]
    meter: CpuMeter
    load: str
    db: DbSampler

    def turns_per_second(self) -> float:
        return self.turns / self.seconds


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def run(cluster: PgCluster, instances: int, args: argparse.Namespace, model_url: str, model_pid: int,
              tmp: Path) -> Row:
    url = cluster.fresh_database()
    postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    async with FakeTelegram() as tg, aiohttp.ClientSession() as http:
        side = TelegramSide(tg)
        extra = {"streaming": {"enabled": False}} if args.no_stream else {}
        if args.via == "telegram":
            extra.update(side.settings())
        daemons = [Daemon(instance_dir(tmp, f"{instances}-{name}"), instance_settings(url, name, model_url, **extra))
                   for name in ("a", "b", "c")[:instances]]
        users: Users
        if args.via == "telegram":
            users = TelegramUsers(tg, args.chats)
        else:
            users = ApiUsers(http, [yaml.safe_load(d.config.read_text())["api"]["port"] for d in daemons], args.chats)
        try:
            first = daemons[0]
            started = await first.start()
            if args.via == "telegram":
                await side.ready(started, 60.0)
            await asyncio.gather(*(d.start() for d in daemons[1:]))
            await users.warm_up()
            meter = CpuMeter([d.proc.pid for d in daemons if d.proc], postmaster, model_pid)
            sampler = DbSampler(url, cluster.url())
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop))
            meter.start()
            latencies, seconds = await users.round(args.messages)
            meter.stop()
            stop.set()
            await sampling
            load = Path("/proc/loadavg").read_text().split()[:3]
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.stop()
    cluster.drop_database(url)
    return Row(instances, args.messages, seconds, latencies, meter, " ".join(load), sampler)


def print_row(row: Row, statements: int = 0) -> None:
    cpu = row.meter.used
    window = row.seconds
    per_instance = "  ".join(f"{cpu[f'instance {n + 1}'] / window:>4.0%}" for n in range(row.instances))
    machine = cpu["machine busy"] / cpu["machine total"] if cpu["machine total"] else 0.0
    db = row.db
    samples = max(db.samples, 1)
    print(f"{row.instances:>9}  {row.turns_per_second():>7.1f}  {_percentile(row.latencies, 50):>6.2f}  "
          f"{_percentile(row.latencies, 95):>6.2f}  {per_instance:<16}  {cpu['postgres'] / window:>8.0%}  "
          f"{cpu['model'] / window:>5.0%}  {cpu['bench'] / window:>5.0%}  {machine:>7.0%}  {row.load:<14}  "
          f"{db.commits / row.turns:>6.1f}  {db.in_transaction / samples:>6.2f}  {db.active / samples:>6.2f}  "
          f"{db.on_lock / samples:>5.2f}  {db.on_lwlock / samples:>6.2f}  {db.rollbacks / row.turns:>6.3f}  "
          f"{'-' if db.round_trips is None else f'{db.round_trips / row.turns:.1f}':>6}", flush=True)
    for n in range(row.instances):
        loop, others = row.meter.threads(n)
        busiest = ", ".join(f"{t / window:.0%}" for t in others[:3])
        print(f"{'':>11}instance {n + 1}: event loop thread {loop / window:.0%}, busiest other threads {busiest}; "
              f"{cpu[f'instance {n + 1}'] * 1000 / row.turns:.1f} ms CPU per turn (all instances: "
              f"{sum(cpu[f'instance {i + 1}'] for i in range(row.instances)) * 1000 / row.turns:.1f}, "
              f"postgres {cpu['postgres'] * 1000 / row.turns:.1f})", flush=True)
    if statements:
        print(f"{'':>11}statements per turn, most run first:")
        for query, count in sorted(db.statements.items(), key=lambda item: -item[1])[:statements]:
            text = " ".join(query.split())
            print(f"{'':>11}{count / row.turns:>6.2f}  {text[:150]}{'...' if len(text) > 150 else ''}", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=600, help="DMs answered in the measured window, per row")
    parser.add_argument("--chats", type=int, default=60, help="chats writing at once (each waits for its answer)")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the fake model takes to answer")
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    parser.add_argument("--via", choices=["telegram", "api"], default="telegram",
                        help="telegram: DMs to the bot that one instance polls for; api: each chat a session of the "
                             "local API, spread over the instances (no platform's rate limits)")
    parser.add_argument("--no-stream", action="store_true",
                        help="replies sent whole (streaming.enabled: false) instead of posted and edited")
    parser.add_argument("--statements", type=int, default=0, metavar="N",
                        help="also print the N statements run most per turn (pg_stat_statements), with how often")
    parser.add_argument("--durable", action="store_true",
                        help="PostgreSQL with fsync and synchronous_commit on (default: as the tests run it, fsync off)")
    args = parser.parse_args()
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    # the fake's requests cut off at a daemon's stop are expected; aiohttp would print each one's traceback
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    settings = {"fsync": "on", "synchronous_commit": "on"} if args.durable else {}
    settings["shared_preload_libraries"] = "pg_stat_statements"  # round trips per turn
    how = "DMs through the fake Telegram (polling)" if args.via == "telegram" else "messages through the local API"
    print(f"{args.messages} {how} from {args.chats} chats (each waits for its answer), fake model "
          f"{args.delay * 1000:.0f} ms, replies {'sent whole' if args.no_stream or args.via == 'api' else 'streamed'}, "
          f"PostgreSQL fsync "
          f"{'on' if args.durable else 'off'}; {os.cpu_count()} cores")
    print("CPU: % of one core over the window; PG: commits per turn, backends in a transaction / active / waiting on "
          "Lock / on LWLock (averages), rollbacks per turn (retried conflicts), round trips (statements) per turn")
    print(f"{'instances':>9}  {'turns/s':>7}  {'p50 s':>6}  {'p95 s':>6}  {'CPU per instance':<16}  {'postgres':>8}  "
          f"{'model':>5}  {'bench':>5}  {'machine':>7}  {'load avg':<14}  {'PG c/t':>6}  {'in txn':>6}  "
          f"{'active':>6}  {'Lock':>5}  {'LWLock':>6}  {'PG r/t':>6}  {'RT/t':>6}")
    model, model_port = await start_model(args.delay)
    cluster = PgCluster.start(settings)
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            try:
                admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            except psycopg.Error as exc:
                print(f"round trips per turn not measured: {exc}".strip())
        with tempfile.TemporaryDirectory() as tmp:
            for n in args.instances:
                print_row(await run(cluster, n, args, f"http://127.0.0.1:{model_port}/v1", model.pid, Path(tmp)),
                          args.statements)
    finally:
        cluster.stop()
        model.terminate()
        await model.wait()


if __name__ == "__main__":
    asyncio.run(main())
