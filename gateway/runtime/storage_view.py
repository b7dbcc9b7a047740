"""How the store's storage report reads to an operator: sizes as text, and for each line the command that
reduces it; shared by ``switchboard storage`` (text and ``--json``) and the dashboard's Storage page.

``report_json(report)`` is the one document both give (``storage --json`` prints it, the page renders it).
"""

from __future__ import annotations

from state import WAL_LIMIT_BYTES, StorageReport

PRUNE = "switchboard sessions prune --older-than DAYS (or store.retention_days)"
DELETE = "switchboard sessions delete ID"
VACUUM = "switchboard maintenance --vacuum (daemon stopped)"
# the tables a prune of sessions empties: the sessions, their messages, the search indexes of the text
_SESSION_TABLES = ("sessions", "messages", "messages_fts", "routes", "inbox", "deliveries")
OBJECTS_SHOWN = 15  # the text lists the largest tables and indexes, then one line for the rest (--json: all)


def size(n: int | None) -> str:
    """``512 B``, ``4.0 KiB``, ``1.2 MiB``, ``3.40 GiB``; ``?`` when unknown."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("KiB", 1024), ("MiB", 1024 ** 2)):
        if n < scale * 1024:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024 ** 3:.2f} GiB"


def object_hint(table: str) -> str | None:
    """What reduces a table (or an index of it): a prune for what holds sessions, else no command."""
    return PRUNE if table.startswith(_SESSION_TABLES) else None


def wal_hint(report: StorageReport) -> str:
    return (f"the daemon's upkeep empties it once it passes {size(WAL_LIMIT_BYTES)} and the daemon is idle; "
            f"{VACUUM} empties it now")


def free_hint(report: StorageReport) -> str:
    if report.auto_vacuum == "incremental":
        return f"the daemon's daily upkeep returns them (auto_vacuum incremental); {VACUUM} at once"
    return VACUUM


def report_json(report: StorageReport) -> dict:
    sqlite = report.engine == "sqlite"
    return {
        "engine": report.engine,
        "db_bytes": report.db_bytes,
        "wal": {"bytes": report.wal_bytes, "reduce": wal_hint(report)} if sqlite else None,
        "free": {"bytes": report.free_bytes, "auto_vacuum": report.auto_vacuum, "reduce": free_hint(report)}
        if sqlite else None,
        "objects_note": report.objects_note,
        "objects": [{"name": o.name, "kind": o.kind, "table": o.table, "bytes": o.bytes,
                     "reduce": object_hint(o.table)} for o in report.objects],
        "text_bytes": report.text_bytes,
        "by_platform": [{"platform": p.key, "messages": p.messages, "text_bytes": p.bytes,
                         "reduce": f"{PRUNE.split(' (')[0]} --source {p.key}"} for p in report.by_platform],
        "by_month": [{"month": m.key, "messages": m.messages, "text_bytes": m.bytes, "reduce": PRUNE}
                     for m in report.by_month],
        "largest_sessions": [{"id": s.session_id, "source": s.source, "title": s.title, "messages": s.messages,
                              "text_bytes": s.bytes, "last_active": s.last_active,
                              "reduce": DELETE.replace("ID", s.session_id)} for s in report.largest_sessions],
    }
