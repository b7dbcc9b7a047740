"""``switchboard storage``: where the store's bytes are, and which command gives each back.

A thin layer: one ``db.storage.report`` call (``state._storage``), printed as tables or, with
``--json``, as one document.  Each line names what reduces it: ``sessions prune`` (or
``store.retention_days``, the daemon's daily prune) for the sessions' tables and text, ``sessions
delete`` for one large session, ``maintenance --vacuum`` for the free pages of an older SQLite file.
The media folder (``media.path``, else ``$home/media``) is outside the store: its files and bytes are
counted on disk, beside how many message references point at them.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from gateway.cli.common import (
    console,
    home_options,
    json_option,
    json_out,
    plural,
    resolve_media,
    resolve_store,
    when,
)
from gateway.runtime.storage_view import (
    DELETE,
    OBJECTS_SHOWN,
    PRUNE,
    free_hint,
    object_hint,
    report_json,
    size,
    wal_hint,
)
from state import SessionDB, StateError, StorageReport
from state.media_files import MediaFiles


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
            references = db.media.stats()
    except StateError as exc:
        raise click.ClickException(str(exc)) from exc
    folder = resolve_media(config_path)
    files, on_disk = MediaFiles(folder).usage()
    media = {"path": str(folder), "files": files, "bytes": on_disk, "references": references["references"],
             "reduce": PRUNE}
    if as_json:
        json_out({**report_json(report), "media": media})
    else:
        _print(report)
        click.echo()
        click.echo(f"Media folder {folder}: {plural(files, 'file')}, {size(on_disk)} (pictures, voice and documents; "
                   f"{plural(references['references'], 'message reference')}); reduce with: {PRUNE}, or {DELETE}")


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
