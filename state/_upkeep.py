"""Automatic upkeep of the store: retention, freed space returned, a bounded WAL, a record of it.

One pass (:func:`run_upkeep`, run once a day by the daemon):

1. **Retention.**  With ``retention_days`` set, ended sessions with no
   activity (start, last message, end) for that long are deleted, children
   kept with their parent link cleared, exactly as ``sessions prune`` does
   (through ``_sessions._delete_ids``).  The work is cut into steps, each its
   own short write transaction: a step deletes at most a budget of message
   text (deleting costs what indexing did, about in proportion to the text),
   and the budget follows the time the last step held the write lock, aiming
   at ``TARGET_HOLD`` (well under ``MAX_HOLD``, 50 ms), so the turns of live
   chats wait for one small step at most.  A session bigger than the budget
   loses its messages over several steps and goes in the last; each step
   checks again that its sessions are still expired (one may have been
   resumed meanwhile).  A step gives way: a live write that comes while it
   runs interrupts it (SQLite's progress handler, see
   ``Engine.write_giving_way``), the step is rolled back and tried again after
   that write, at half the size (after ``GIVE_WAY_TRIES`` in a row, once
   without giving way, so the pass ends under any load); the async store
   runs the steps on a thread of their own for that.  After each step the
   pass pauses twice as long as the step took, so live writes queued
   meanwhile go first, and meanwhile it checkpoints on a connection of its
   own, so that no commit (ours or a live write's) runs SQLite's
   checkpoint-at-commit.  FTS5's
   automerge is off meanwhile: it merges in quanta of 64 pages per level, and
   one prune step in a few would hold the lock for tens of milliseconds; the
   same merging is done after each step in small steps of its own, and
   automerge is turned back on at the end of the pass (a pass cut short
   leaves it off until the next one, with or without retention; FTS5's
   crisis merge still bounds the segments meanwhile).
2. **The search index.**  Deleting a message adds a deletion entry to each
   FTS5 index it was in, beside its own entries: a prune makes the indexes
   bigger, not smaller.  After a large prune (``MERGE_AFTER_MESSAGES``, or a
   tenth of the messages) each index is merged down to one segment, which
   drops both: the work of ``optimize`` in small steps, paced like the prune
   (started once, then continued: see :func:`merge_step`).  Segments written
   by new messages meanwhile are left to the ordinary merges.
3. **Space back to the file system.**  A database created by this version
   has ``auto_vacuum=INCREMENTAL``: free pages are returned by
   ``PRAGMA incremental_vacuum(N)``, again in small steps, and a checkpoint
   then shrinks the file.  An older database (``auto_vacuum=NONE``) only
   reuses its free pages; ``switchboard maintenance --vacuum`` converts it
   once, with the daemon stopped.
4. **The WAL.**  When it has grown past ``wal_limit_bytes`` and the daemon
   is idle, a ``TRUNCATE`` checkpoint empties it.
5. **A record** in the ``meta`` table (key ``last_upkeep``): when the pass
   ran and what it did, shown by ``switchboard doctor`` and ``/healthz``.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A prune step locks the sessions it found expired
(``FOR UPDATE``, ``WHERE`` read again: one reopened meanwhile is left alone) before deleting their
messages; the other steps are SQLite's own (FTS5 merges, vacuum) or one upsert (``record``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, NamedTuple, Protocol, TypeVar

from . import _sessions
from ._dialect import StoreSize, dialect_of, file_size
from ._lock import GaveWay
from ._repo import Repository, reads, upkeep_steps, writes
from .search import MergeStep, search_index

log = logging.getLogger(__name__)

T = TypeVar("T")

DAY = 86_400.0
MAX_HOLD = 0.050  # the longest a step may hold the write lock
TARGET_HOLD = 0.002  # what the step budgets aim at (a step's cost varies with message sizes)
FIRST_BUDGET = 16_384  # bytes of message text deleted by the first step; then adapted
MIN_BUDGET, MAX_BUDGET = 2_048, 4_000_000
MESSAGE_OVERHEAD = 64  # bytes counted per message besides its text (its row, its index entries)
BATCH_MESSAGES = 2_000  # sessions are taken together while they hold fewer messages than this
FIRST_VACUUM_PAGES = 64
FIRST_MERGE_PAGES = 16
MIN_MERGE_PAGES = 4  # FTS5 finishes the term it is in before it stops: a step is at least one term's pages
# The most pages one merge or vacuum step asks for, whatever the last steps cost: a merge's pages
# are the pages it writes, and after a prune it may read many more (the deleted entries it drops);
# a vacuum step's cost per page depends on where in the file the pages are moved from.
MAX_MERGE_PAGES, MAX_VACUUM_PAGES = 128, 2_048
PAUSE = 2.0  # after each step the pass pauses this many times as long as the step held the lock
CHECKPOINT_AFTER_HOLD = 0.004  # seconds of write lock held by the steps between two checkpoints beside them
GIVE_WAY_TRIES = 4  # a step a live write interrupted this many times in a row runs once more without giving way
MERGE_AFTER_MESSAGES = 10_000  # a prune of this many messages (or a tenth of them all) merges the indexes
WAL_LIMIT_BYTES = 64 * 1024 * 1024
LAST_UPKEEP = "last_upkeep"
CHECKPOINT_ATTEMPTS, CHECKPOINT_PAUSE = 20, 0.05


#: Schema v18, on both engines (``state._dialect``'s type tokens).
TABLES = ("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at {REAL} NOT NULL)",)


def create_tables(conn: sqlite3.Connection) -> None:
    """Schema v18: small facts about the store itself, by key (``last_upkeep``: JSON)."""
    dialect_of(conn).create(conn, TABLES)


# --- steps on a connection (each SessionDB method runs one in its own transaction) ----------------


class Timed(NamedTuple):
    """When a step's transaction took the write lock (``time.perf_counter``) and how long it held it."""

    began: float
    seconds: float
    commit: float = 0.0  # of which its COMMIT (and a checkpoint SQLite may run at commit)


def expired_sessions(conn: sqlite3.Connection, cutoff: float) -> list[tuple[str, int]]:
    """(id, message count) of the ended sessions with no activity since ``cutoff``, oldest first."""
    return [(r[0], r[1] or 0) for r in conn.execute(
        f"SELECT id, message_count FROM sessions WHERE {_sessions.EXPIRED} ORDER BY started_at", (cutoff,))]


@dataclass(frozen=True, slots=True)
class PruneStep:
    deleted: list[str]  # sessions gone
    dropped: list[str]  # sessions no longer expired (or already gone): left alone
    messages: int  # messages deleted
    size: int = 0  # their text in bytes (plus MESSAGE_OVERHEAD each): what the step's cost follows
    by_session: dict[str, int] = field(default_factory=dict)  # messages deleted, per session


def prune_step(conn: sqlite3.Connection, session_ids: list[str], cutoff: float, max_bytes: int) -> PruneStep:
    """Delete these sessions' messages up to about ``max_bytes`` of text (at least one message;
    deleting a message costs about as much as indexing it did), then the sessions left empty."""
    ids = json.dumps(list(session_ids))
    dialect = dialect_of(conn)
    values = dialect.json_values("$1")  # the JSON array of ids, as $1
    # locked as found (PostgreSQL): an append racing the prune waits, and a session reopened meanwhile is dropped
    still = [r[0] for r in conn.execute(
        f"SELECT id FROM sessions WHERE id IN ({dialect.json_values('$2')}) AND {_sessions.EXPIRED}"
        f" ORDER BY id{dialect.for_update}",
        (cutoff, ids))]
    dropped = sorted(set(session_ids) - set(still))
    if not still:
        return PruneStep([], dropped, 0)
    doomed: list = []
    by_session: dict[str, int] = {}
    total = 0
    for msg_id, sid, size in conn.execute(
        f"SELECT id, session_id, {dialect.byte_length('content')} + {dialect.byte_length('tool_calls')}"
        f" + {MESSAGE_OVERHEAD} FROM messages WHERE session_id IN ({values}) LIMIT $2",
        (json.dumps(still), max_bytes // MESSAGE_OVERHEAD + 1),  # no more rows than could fit
    ):
        if doomed and total + size > max_bytes:
            break
        doomed.append(msg_id)
        by_session[sid] = by_session.get(sid, 0) + 1
        total += size
    messages_ids = dialect.json_values("$1", integers=True)
    messages = conn.execute(f"DELETE FROM messages WHERE id IN ({messages_ids})", (json.dumps(doomed),)).rowcount
    left = f"SELECT j.value FROM ({values}) AS j WHERE NOT EXISTS (SELECT 1 FROM messages WHERE session_id = j.value)"
    empty = [r[0] for r in conn.execute(left, (json.dumps(still),))]
    _sessions._delete_ids(conn, empty)
    return PruneStep(empty, dropped, messages, total, by_session)


FTS_TABLES = ("messages_fts", "messages_fts_trigram")


def fts_table(name: str) -> str:
    if name not in FTS_TABLES:
        raise ValueError(f"not a search index: {name!r} (one of {', '.join(FTS_TABLES)})")
    return name


def fts_segments(conn: sqlite3.Connection, table: str) -> list[int]:
    """The segments the search index ``table`` holds now (see ``SearchIndex.segments``)."""
    return search_index(conn).segments(conn, table)


def merge_step(conn: sqlite3.Connection, table: str, pages: int, segments: list[int] | None = None,
               start: bool = False) -> MergeStep:
    """Merge about ``pages`` pages of the search index ``table`` (see ``state.search.fts5.merge_step``)."""
    return search_index(conn).merge_step(conn, table, pages, segments, start)


def set_automerge(conn: sqlite3.Connection, on: bool) -> None:
    """Turn the search index's own merging on or off (see ``state.search.fts5.set_automerge``)."""
    search_index(conn).set_automerge(conn, on)


def vacuum_step(conn: sqlite3.Connection, pages: int) -> int:
    """Return up to ``pages`` free pages to the file system (``auto_vacuum=INCREMENTAL`` only)."""
    before = conn.execute("PRAGMA freelist_count").fetchone()[0]
    # One page each: sqlite3 runs a statement that names no result columns for one step only,
    # and PRAGMA incremental_vacuum frees one page per step.
    for _ in range(min(before, max(1, int(pages)))):
        conn.execute("PRAGMA incremental_vacuum(1)")
    return before - conn.execute("PRAGMA freelist_count").fetchone()[0]


def store_size(conn: sqlite3.Connection, path: Path | None) -> StoreSize:
    """The file sizes and free pages; on PostgreSQL the database's size (its own autovacuum reuses
    free space: nothing for upkeep to vacuum, no WAL of ours)."""
    return dialect_of(conn).store_size(conn, path)


def record(conn: sqlite3.Connection, key: str, value: dict) -> None:
    conn.execute(
        "INSERT INTO meta (key, value, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        (key, json.dumps(value, sort_keys=True), time.time()),
    )


def recorded(conn: sqlite3.Connection, key: str) -> dict | None:
    row = conn.execute("SELECT value FROM meta WHERE key = $1", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def vacuum_database(path: Path) -> tuple[int, int]:
    """Rewrite the whole file without its free pages, with ``auto_vacuum=INCREMENTAL`` from now on.

    The one-time conversion of a database made before upkeep existed.  Takes
    the write lock for as long as the rewrite lasts and needs free disk space
    for a second copy meanwhile: only with the daemon stopped (the caller holds
    the home's lock).  Returns the file's size before and after, in bytes.
    """
    before = file_size(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect with the VACUUM
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return before, file_size(path)


# --- one pass ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """One step of a pass: what it was, when it took the write lock (``time.perf_counter``), how long."""

    kind: str  # prune | merge | vacuum | automerge | checkpoint
    detail: str  # its size: sessions and messages deleted, pages asked and written...
    began: float
    ms: float
    commit_ms: float = 0.0  # of which its COMMIT

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}: {self.ms:.1f} ms (commit {self.commit_ms:.1f} ms)"


@dataclass(slots=True)
class UpkeepReport:
    """What one pass did (stored as the ``last_upkeep`` record)."""

    started_at: float
    finished_at: float = 0.0
    retention_days: float | None = None
    sessions_pruned: int = 0
    messages_pruned: int = 0
    steps: int = 0  # write transactions taken
    gave_way: int = 0  # of which a live write interrupted (rolled back, tried again after it at half the size)
    longest_hold_ms: float = 0.0  # the longest any of them held the write lock
    index_merged: bool = False  # the search indexes were merged after a large prune
    pages_vacuumed: int = 0
    wal_truncated: bool = False
    db_bytes_before: int = 0
    db_bytes_after: int = 0
    wal_bytes_after: int = 0
    vacuum_needed: bool = False  # free space an old database (auto_vacuum=NONE) cannot return by itself
    longest_hold_ms_by_step: dict = field(default_factory=dict)  # prune | merge | vacuum -> ms
    longest_hold: str = ""  # the step that held the lock longest, and its size ("merge messages_fts: 128 pages ...")
    holds: list[Hold] = field(default_factory=list, repr=False)  # every step, in order (not recorded)
    checkpoints: list[Hold] = field(default_factory=list, repr=False)  # beside the writers: no write lock

    @property
    def holds_ms(self) -> list[float]:
        return [h.ms for h in self.holds]

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("holds")
        out.pop("checkpoints")
        return out


class _Pacer:
    """Sizes the steps of one kind so each holds the write lock about TARGET_HOLD: from the median
    cost per unit (byte, page) of the last few steps, so one slow step (the machine was busy)
    does not shrink the next ones to nothing, nor one fast step blow them up."""

    def __init__(self, first: int, lo: int, hi: int):
        self.size, self.lo, self.hi = first, lo, hi
        self._costs: deque[float] = deque(maxlen=9)

    def done(self, units: int, hold: float) -> None:
        if units > 0:
            self._costs.append(hold / units)
        if self._costs:
            wanted = TARGET_HOLD / max(statistics.median(self._costs), 1e-9)
            self.size = int(min(self.hi, max(self.lo, min(wanted, self.size * 2))))


class UpkeepSteps(Protocol):
    """What a pass calls on ``db.upkeep``: :class:`Upkeep`'s methods as the async store's coroutines."""

    async def store_size(self) -> StoreSize: ...
    async def expired_sessions(self, cutoff: float) -> list[tuple[str, int]]: ...
    async def prune_step(self, session_ids: list[str], cutoff: float, max_bytes: int, *,
                         gives_way: bool = ...) -> tuple[PruneStep, Timed]: ...
    async def fts_segments(self, table: str) -> list[int]: ...
    async def merge_step(self, table: str, pages: int, segments: list[int] | None = ..., start: bool = ..., *,
                         gives_way: bool = ...) -> tuple[MergeStep, Timed]: ...
    async def automerge(self, on: bool) -> Timed: ...
    async def vacuum_step(self, pages: int, *, gives_way: bool = ...) -> tuple[int, Timed]: ...
    async def record(self, report: dict) -> None: ...


class MessageCount(Protocol):
    """What a pass calls on ``db.messages``."""

    async def count(self, session_id: str | None = ...) -> int: ...


class UpkeepStore(Protocol):
    """What a pass calls on the store: :class:`state.AsyncSessionDB`'s coroutines of these names (a
    narrow view, since this module cannot import the async store it is part of; mypy checks at each
    call of :func:`run_upkeep` that the store given has them, with these signatures)."""

    @property
    def upkeep(self) -> UpkeepSteps: ...

    @property
    def messages(self) -> MessageCount: ...

    async def checkpoint_aside(self, mode: str = ...) -> tuple[int, int, int]: ...


async def run_upkeep(db: UpkeepStore, *, retention_days: float | None, now: float | None = None,
                     idle: Callable[[], bool] = lambda: True, wal_limit_bytes: int = WAL_LIMIT_BYTES) -> UpkeepReport:
    """One upkeep pass over an :class:`state.AsyncSessionDB` (see the module docstring)."""
    now = time.time() if now is None else now
    report = UpkeepReport(started_at=now, retention_days=retention_days)
    size = await db.upkeep.store_size()
    report.db_bytes_before = size.db_bytes

    uncopied = 0.0  # seconds the steps held the lock since the last checkpoint

    async def held(kind: str, detail: str, timed: Timed) -> None:
        hold = Hold(kind, detail, timed.began, timed.seconds * 1000, timed.commit * 1000)
        report.steps += 1
        report.holds.append(hold)
        if hold.ms > report.longest_hold_ms:
            report.longest_hold_ms, report.longest_hold = hold.ms, str(hold)
        report.longest_hold_ms_by_step[kind] = max(report.longest_hold_ms_by_step.get(kind, 0.0), hold.ms)
        if hold.ms > MAX_HOLD * 1000:
            log.debug("upkeep: %s held the write lock longer than %.0f ms", hold, MAX_HOLD * 1000)
        # Live writes queued meanwhile go first.  Meanwhile the steps' pages are copied to the
        # database beside the writers, once the steps since the last copy held the lock for
        # CHECKPOINT_AFTER_HOLD: a step writes up to hundreds of pages, and a WAL left to grow past
        # SQLite's checkpoint-at-commit size (4,000 pages) makes the commit that crosses it (ours or
        # a live write's) copy thousands of pages and fsync, under the lock.  A copy after every
        # step was worse: its fsyncs slowed the commits beside it (a prune step's p99 7.6 ms, not 2.4).
        nonlocal uncopied
        uncopied += timed.seconds
        if uncopied >= CHECKPOINT_AFTER_HOLD:
            uncopied = 0.0
            copying = asyncio.ensure_future(checkpoint("PASSIVE"))
            await asyncio.sleep(timed.seconds * PAUSE)
            await copying
        else:
            await asyncio.sleep(timed.seconds * PAUSE)

    async def checkpoint(mode: str) -> tuple[int, int, int]:
        began = time.perf_counter()
        result = await db.checkpoint_aside(mode)
        report.checkpoints.append(Hold("checkpoint", f"{mode} {result[2]}/{result[1]} pages",
                                       began, (time.perf_counter() - began) * 1000))
        return result

    async def attempt(kind: str, call: Callable[..., Awaitable[tuple[Any, Timed]]], size: int,
                      least: int) -> tuple[int, Any, Timed]:
        """Run a step of ``size`` (``call(size, gives_way=...)``).  A live write that comes while it
        runs interrupts it (rolled back) and goes first; the step is tried again after the pause,
        at half the size, and after GIVE_WAY_TRIES such tries without giving way, so that it is
        done even under a steady stream of writes.  Returns the size done, the result, the hold."""
        tries = 0
        while True:
            try:
                result, timed = await call(size, gives_way=tries < GIVE_WAY_TRIES)
                return size, result, timed
            except GaveWay as exc:
                report.gave_way += 1
                await held(kind, f"{size:,} asked: gave way to a live write", exc.timed)
                size, tries = max(least, size // 2), tries + 1

    merge_pacer = _Pacer(FIRST_MERGE_PAGES, MIN_MERGE_PAGES, MAX_MERGE_PAGES)

    async def merge(table: str, segments: list[int] | None = None) -> None:
        start = segments is not None
        while True:
            pages, step, timed = await attempt(
                "merge", functools.partial(db.upkeep.merge_step, table, segments=segments, start=start),
                merge_pacer.size, MIN_MERGE_PAGES)
            await held("merge", f"{table}{' (full, first step)' if start else ' (full)' if segments else ''}: "
                       f"{pages} pages asked, {step.worked} rows changed", timed)
            if not step.worked or (segments is not None and not step.left):
                return
            # the cost per page asked: FTS5 writes about that many leaves, and several rows each
            # (the leaf, the input pages it drops, the segment's index): rows would size the steps 4x
            merge_pacer.done(pages, timed.seconds)
            start = False

    queue = await db.upkeep.expired_sessions(now - retention_days * DAY) if retention_days else []
    if queue:
        assert retention_days is not None  # only a retention finds sessions to prune
        await held("automerge", "off", await db.upkeep.automerge(False))
        try:
            pacer, cutoff = _Pacer(FIRST_BUDGET, MIN_BUDGET, MAX_BUDGET), now - retention_days * DAY
            while queue:
                batch: list[str] = []
                weight = 0
                for sid, count in queue:
                    if batch and weight + count > min(BATCH_MESSAGES, pacer.size // MESSAGE_OVERHEAD):
                        break
                    batch.append(sid)
                    weight += count
                budget, step, timed = await attempt(
                    "prune", functools.partial(db.upkeep.prune_step, batch, cutoff), pacer.size, MIN_BUDGET)
                await held("prune", f"{len(batch)} sessions asked, {step.messages} messages "
                           f"({step.size:,} of {budget:,} bytes), {len(step.deleted)} sessions deleted", timed)
                report.sessions_pruned += len(step.deleted)
                report.messages_pruned += step.messages
                finished = set(step.deleted) | set(step.dropped)
                taken = len(batch)  # the batch is the queue's head
                queue = [(sid, max(0, count - step.by_session.get(sid, 0))) for sid, count in queue[:taken]
                         if sid not in finished] + queue[taken:]
                pacer.done(step.size, timed.seconds)
                for table in FTS_TABLES:
                    await merge(table)

            if report.messages_pruned and report.messages_pruned >= min(
                    MERGE_AFTER_MESSAGES, (report.messages_pruned + await db.messages.count()) // 10):
                # A prune leaves a deletion entry in the search indexes for every message it
                # deleted, on top of the message's own entries: merged into one segment, both go.
                for table in FTS_TABLES:
                    segments = await db.upkeep.fts_segments(table)
                    if len(segments) > 1:
                        await merge(table, segments)
                    await merge(table)
                report.index_merged = True
        finally:
            await held("automerge", "on", await db.upkeep.automerge(True))
    else:
        await held("automerge", "on", await db.upkeep.automerge(True))  # in case a pass was cut short, even with retention since turned off

    size = await db.upkeep.store_size()
    if size.auto_vacuum == "incremental":
        pacer = _Pacer(FIRST_VACUUM_PAGES, 8, MAX_VACUUM_PAGES)
        while size.free_pages > 0:
            pages, freed, timed = await attempt(
                "vacuum", db.upkeep.vacuum_step, pacer.size, 8)
            await held("vacuum", f"{pages} pages asked, {freed} freed", timed)
            report.pages_vacuumed += freed
            if freed <= 0:
                break
            size = await db.upkeep.store_size()
            pacer.done(freed, timed.seconds)
    else:
        report.vacuum_needed = size.free_pages > 0

    # the file shrinks when the checkpoint writes the vacuumed pages back; the WAL empties when idle
    size = await db.upkeep.store_size()
    truncate = size.wal_bytes > wal_limit_bytes and idle()
    for _attempt in range(CHECKPOINT_ATTEMPTS):  # another checkpoint or a reader's snapshot may be in the way
        busy, wal_pages, copied = await checkpoint("TRUNCATE" if truncate else "PASSIVE")
        if not busy and copied == wal_pages:
            break
        await asyncio.sleep(CHECKPOINT_PAUSE)
    report.wal_truncated = truncate and not busy
    size = await db.upkeep.store_size()
    report.db_bytes_after, report.wal_bytes_after = size.db_bytes, size.wal_bytes
    report.finished_at = max(now, time.time())
    await db.upkeep.record(report.as_dict())
    return report


class Upkeep(Repository):
    """``db.upkeep``: the steps of an upkeep pass (:func:`run_upkeep`), each one short write
    transaction, and the record of the last pass."""

    @reads
    def store_size(self) -> StoreSize:
        """The database and WAL file sizes, page size, free pages and auto_vacuum mode."""
        return self._engine.read(store_size, self._file)

    @reads
    def expired_sessions(self, cutoff: float) -> list[tuple[str, int]]:
        """(id, message count) of ended sessions with no activity since ``cutoff``, oldest first."""
        return self._engine.read(expired_sessions, cutoff)

    @upkeep_steps
    def prune_step(self, session_ids: list[str], cutoff: float, max_bytes: int, *,
                   gives_way: bool = True) -> tuple[PruneStep, Timed]:
        """One retention step (about ``max_bytes`` of message text deleted); returns it and its lock hold.
        ``gives_way``: a write from another thread that comes meanwhile interrupts it (see ``_timed_write``)."""
        return self._timed_write(prune_step, list(session_ids), cutoff, max_bytes, gives_way=gives_way)

    @reads
    def fts_segments(self, table: str) -> list[int]:
        """The segments the FTS5 index ``table`` (one of ``state._upkeep.FTS_TABLES``) holds now."""
        return self._engine.read(fts_segments, fts_table(table))

    @upkeep_steps
    def merge_step(self, table: str, pages: int, segments: list[int] | None = None,
                   start: bool = False, *, gives_way: bool = True) -> tuple[MergeStep, Timed]:
        """One step (about ``pages`` pages) of merging the FTS5 index ``table`` (down from ``segments``
        when given: see ``state._upkeep.merge_step``); returns it and its lock hold."""
        return self._timed_write(merge_step, fts_table(table), pages,
                                 None if segments is None else list(segments), bool(start), gives_way=gives_way)

    @writes
    def automerge(self, on: bool) -> Timed:
        """Turn FTS5's automerge of the search indexes on or off (off while upkeep prunes)."""
        return self._timed_write(set_automerge, bool(on), gives_way=False)[1]

    @upkeep_steps
    def vacuum_step(self, pages: int, *, gives_way: bool = True) -> tuple[int, Timed]:
        """Up to ``pages`` free pages returned to the file system; returns how many and the lock hold."""
        return self._timed_write(vacuum_step, pages, gives_way=gives_way)

    @writes
    def record(self, report: dict) -> None:
        self._engine.write(record, LAST_UPKEEP, report)

    @reads
    def last(self) -> dict | None:
        """What the last upkeep pass did (``state._upkeep.UpkeepReport`` as a dict), or None."""
        return self._engine.read(recorded, LAST_UPKEEP)

    def _timed_write(self, fn: Callable[..., T], *args: Any, gives_way: bool = True) -> tuple[T, Timed]:
        """``fn``'s result and when its transaction took the write lock and for how long (begin to
        commit, ``time.perf_counter`` seconds).  Giving way (the default), a write from another
        thread interrupts it: :class:`state._lock.GaveWay` is raised, its ``timed`` set."""
        began: list[float] = []

        def run(conn):
            began.append(time.perf_counter())
            out = fn(conn, *args)
            began.append(time.perf_counter())  # the commit comes next
            return out

        try:
            result = self._engine.write_giving_way(run) if gives_way else self._engine.write(run)
        except GaveWay as exc:
            exc.timed = Timed(began[0], time.perf_counter() - began[0])
            raise
        end = time.perf_counter()
        return result, Timed(began[-2], end - began[-2], end - began[-1])
