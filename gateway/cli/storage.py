"""``switchboard storage``: where the store's bytes are, and which command gives each back.

A thin layer: one ``db.storage.report`` call (``state._storage``), printed as tables or, with
``--json``, as one document.  Each line names what reduces it: ``sessions prune`` (or
``store.retention_days``, the daemon's daily prune) for the sessions' tables and text, ``sessions
delete`` for one large session, ``maintenance --vacuum`` for the free pages of an older SQLite file.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from gateway.cli.common import console, home_options, json_option, json_out, resolve_store, when
from state import WAL_LIMIT_BYTES, SessionDB, StateError, StorageReport

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


@click.command("storage")
@click.option("--top", type=click.IntRange(min=0, max=1000), default=20, show_default=True,
              help="How many of the largest sessions to list.")
@json_option("Print JSON for scripts.")
@home_options
def storage_cmd(config_path: Path | None, top: int, as_json: bool) -> None:
    """Where the store's bytes are: each table and index, the message text by platform and by month,
    the largest sessions, the WAL and the free pages, each with the command that reduces it.

    Tables and indexes are their size on disk (SQLite's dbstat; PostgreSQL's relation sizes, a table's
    with its TOAST).  By platform, by month and per session it is the size of the messages' text
    (content and tool calls), not of the pages holding it: rows, indexes and the search index come on top."""
    target = resolve_store(config_path)
    if isinstance(target, Path) and not target.exists():  # a report creates nothing (a mistyped --home)
        raise click.ClickException(f"no database at {target}: nothing stored yet (is --home or "
                                   "$SWITCHBOARD_HOME the daemon's home?)")
    try:
        with SessionDB(target) as db:
            report = db.storage.report(top)
    except StateError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        json_out(_json(report))
    else:
        _print(report)


def _json(report: StorageReport) -> dict:
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


def _table(title: str, *columns: str) -> Table:
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for name in columns:
        table.add_column(name, justify="left" if name in ("name", "platform", "month", "session", "title",
                                                          "reduce with", "kind", "last active") else "right",
                         no_wrap=name != "title")
    return table


def _print(report: StorageReport) -> None:
    out = console()
    click.echo(f"Store ({report.engine}): {size(report.db_bytes)} on disk")
    if report.engine == "sqlite":
        click.echo(f"WAL: {size(report.wal_bytes)}; reduce with: {wal_hint(report)}")
        click.echo(f"Free pages a vacuum would return: {size(report.free_bytes)}; reduce with: {free_hint(report)}")
    else:
        click.echo("PostgreSQL keeps its own WAL and reuses freed space itself (autovacuum): nothing to list here.")
    click.echo()
    objects = _table("Tables and indexes (on disk)", "name", "kind", "bytes", "reduce with")
    shown, rest = report.objects[:OBJECTS_SHOWN], report.objects[OBJECTS_SHOWN:]
    for o in shown:
        objects.add_row(o.name, o.kind if o.kind == "table" else f"index of {o.table}", size(o.bytes),
                        object_hint(o.table) or "-", end_section=bool(rest) and o is shown[-1])
    if rest:
        known = [o.bytes for o in rest if o.bytes is not None]
        objects.add_row(f"{len(rest)} more", "", size(sum(known)) if known else "?", "(--json lists them)",
                        style="dim")
    out.print(objects)
    if report.objects_note:
        click.echo(f"Note: {report.objects_note}")
    click.echo()
    if not report.by_platform:
        click.echo("No messages stored.")
        return
    click.echo(f"Message text: {size(report.text_bytes)} (the text's size, not the pages holding it)")
    platforms = _table("By platform", "platform", "messages", "text", "reduce with")
    for p in report.by_platform:
        platforms.add_row(p.key, f"{p.messages:,}", size(p.bytes), f"{PRUNE.split(' (')[0]} --source {p.key}")
    out.print(platforms)
    months = _table("By month (UTC)", "month", "messages", "text", "reduce with")
    for m in report.by_month:
        months.add_row(m.key, f"{m.messages:,}", size(m.bytes), PRUNE)
    out.print(months)
    largest = _table(f"The {len(report.largest_sessions)} largest sessions", "session", "platform", "title",
                     "messages", "text", "last active", "reduce with")
    for s in report.largest_sessions:
        largest.add_row(s.session_id, s.source, s.title or "-", f"{s.messages:,}", size(s.bytes),
                        when(s.last_active), DELETE.replace("ID", s.session_id))
    out.print(largest)
