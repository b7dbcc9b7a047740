"""``switchboard sessions``: list, show, search, export, import, delete, rename, prune, stats.

A thin layer: open the store, call one ``SessionDB`` method, print.  State
errors become one line on stderr and exit status 1.
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from gateway.cli.common import (
    InstalledChoice,
    console as _console,
    forget_media,
    json_option,
    json_out as _json_out,
    plural,
    remember_home,
    when as _when,
    with_store,
)
from gateway.platforms import sources
from state import AmbiguousSession, SessionDB, parse_jsonl, read_hermes

_MARKED = re.compile(r">>>(.*?)<<<", re.S)
ROLES = ("user", "assistant", "tool", "system")
HERMES_TITLE_SUFFIX = " (Hermes)"  # an imported title another session here holds already


def _source_option(help_text: str, multiple: bool = False):
    """``--source``: one of the known sources, any case (``API`` means ``api``); anything else is an error."""
    return click.option("--source", multiple=multiple, type=InstalledChoice(sources),
                        help=help_text)
def relative_time(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    delta = (time.time() if now is None else now) - ts
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)}m ago"
    if delta < 86400:
        return f"{int(delta // 3600)}h ago"
    if delta < 2 * 86400:
        return "yesterday"
    if delta < 30 * 86400:
        return f"{int(delta // 86400)}d ago"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d")

def _user(row: dict) -> Text:
    """Who the session is with: the user's name, else their id; ``—`` for none (a cron run)."""
    return Text(row.get("user_name") or row.get("user_id") or "—")


def highlighted(snippet: str) -> Text:
    """A search snippet with its ``>>>match<<<`` markers turned into highlight: reverse video in a terminal,
    plain text (no markers) when the output is piped; ``--json`` keeps the markers for scripts."""
    text = Text()
    for i, part in enumerate(_MARKED.split(snippet.replace("\n", " "))):
        text.append(part, style="bold reverse" if i % 2 else "")
    return text


def _candidates(db: SessionDB, ref: str, exc: AmbiguousSession, unchanged: str) -> click.ClickException:
    """The error listing the sessions ``ref`` may mean, each with its title."""
    lines = [f"{ref!r} does not name one session exactly; {unchanged}. Give the id or the exact title of one of:"]
    for session_id in exc.candidates[:20]:
        title = db.titles.get(session_id)
        lines.append(f"  {session_id}" + (f"  {title}" if title else ""))
    if len(exc.candidates) > 20:
        lines.append(f"  ... and {len(exc.candidates) - 20} more")
    return click.ClickException("\n".join(lines))


def _exactly(db: SessionDB, ref: str, unchanged: str) -> str:
    """The one session ``ref`` names by id or exact title (in any case when only one fits); otherwise the
    candidates and no action."""
    try:
        return db.sessions.resolve_exactly(ref)
    except AmbiguousSession as exc:
        raise _candidates(db, ref, exc, unchanged) from None


def _resolve(db: SessionDB, ref: str, unchanged: str) -> str:
    """The session ``ref`` names: an id, a unique id prefix, or a title (in any case; the newest of its
    lineage); otherwise the candidates."""
    try:
        return db.sessions.resolve_id(ref)
    except AmbiguousSession as exc:
        raise _candidates(db, ref, exc, unchanged) from None


def _confirm(question: str, yes: bool) -> None:
    if not yes and not click.confirm(question, default=False):
        raise click.ClickException("nothing was changed (pass --yes to skip this question)")


@click.group("sessions")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None, hidden=True,
              expose_value=False, callback=remember_home)  # the older place: `sessions --home DIR list`
def sessions() -> None:
    """Browse, search, export and clean up stored conversations."""


@sessions.command("list")
@_source_option("Only sessions from this source.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Show every session of a compression chain or of a conversation that branched, not just its tip.")
@json_option("Print JSON for scripts.")
@with_store
def list_cmd(db: SessionDB, source: str | None, limit: int, show_all: bool, as_json: bool) -> None:
    """List the most recently active sessions: title, preview, last activity, id."""
    rows = db.sessions.list_rich(source=source, limit=limit, include_children=show_all)
    if as_json:
        _json_out([{k: v for k, v in row.items() if k != "system_prompt"} for row in rows])
        return
    if not rows:
        click.echo("No sessions." if not source else f"No sessions from {source}.")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("Title", max_width=30, overflow="ellipsis", no_wrap=True)
    table.add_column("Preview", max_width=50, overflow="ellipsis", no_wrap=True)
    table.add_column("Last active", no_wrap=True)
    table.add_column("Src", no_wrap=True)
    table.add_column("User", max_width=20, overflow="ellipsis", no_wrap=True)
    table.add_column("ID", no_wrap=True, min_width=max(len(r["id"]) for r in rows))
    for row in rows:
        table.add_row(row.get("title") or "—", row.get("preview") or "", relative_time(row.get("last_active")),
                      row["source"], _user(row), row["id"])
    _console().print(table)


@sessions.command("show")
@click.argument("ref")
@json_option("Print the session and its messages as JSON.")
@with_store
def show_cmd(db: SessionDB, ref: str, as_json: bool) -> None:
    """Show one session (by id, unique id prefix, or title) and its messages."""
    session_id = _resolve(db, ref, "nothing is shown")
    data = db.transfer.export(session_id)
    if data is None:  # deleted between the two calls
        raise click.ClickException(f"session {session_id} no longer exists")
    approvals = data.get("approvals") or []  # tool calls that asked a person first
    if as_json:
        _json_out(data)
        return
    lines = [
        f"Session   {data['id']}",
        f"Title     {data.get('title') or '—'}",
        f"Source    {data['source']}" + (f"  user {data['user_name'] or data['user_id']}" if data.get("user_id") else ""),
        f"Model     {data.get('model') or '—'}",
        f"Started   {_when(data['started_at'])}",
        f"Ended     {_when(data['ended_at'])}" + (f" ({data['end_reason']})" if data.get("end_reason") else ""),
        f"Messages  {data['message_count']}  tool calls {data['tool_call_count']}  "
        f"tokens in {data['input_tokens']} out {data['output_tokens']}",
    ]
    if data.get("parent_session_id"):
        parent = db.sessions.get(data["parent_session_id"])
        if parent is not None and parent.end_reason != "compression" and data.get("source") == "api" and \
                data.get("session_key") and \
                parent.session_key == data.get("session_key"):
            # a local-API client edited a message or regenerated an answer: the conversation went on here
            lines.append(f"Branched  from {data['parent_session_id']}" + (f" ({parent.title})" if parent.title else ""))
        else:
            lines.append(f"Parent    {data['parent_session_id']}")
    tip = db.sessions.compression_tip(session_id)
    if tip != session_id:
        lines.append(f"Continued {tip}")
    click.echo("\n".join(lines))
    decided = {row["tool_call_id"]: row for row in approvals if row.get("tool_call_id")}
    for message in data["messages"]:
        head = f"[{_when(message['timestamp'])}] {message['role']}"
        if message.get("tool_name"):
            head += f" ({message['tool_name']})"
        if message["role"] == "tool" and message.get("tool_call_id") in decided:
            head += f"  [{_approval_line(decided[message['tool_call_id']])}]"
        click.echo(f"\n{head}")
        if message.get("content"):
            click.echo(message["content"])
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            click.echo(f"  -> {fn.get('name', '?')}({fn.get('arguments', '')})")
    waiting = [row for row in approvals if row["status"] == "pending"]
    for row in waiting:
        click.echo(f"\n[{_when(row['requested_at'])}] waiting for approval: {row['tool']} (request {row['id']}, "
                   f"until {_when(row['expires_at'])})")


def _approval_line(row: dict) -> str:
    """How a tool call's approval went, for ``sessions show``."""
    what = {"done": "approved", "approved": "approved", "interrupted": "approved, cut off by a restart",
            "denied": "denied", "expired": "not answered in time: denied"}.get(row["status"], row["status"])
    by = f" by {row['decided_by']}" if row.get("decided_by") else ""
    return f"{what}{by} at {_when(row['decided_at'])}, request {row['id']}, sha256 {row['call_hash'][:16]}"


@sessions.command("search")
@click.argument("query")
@_source_option("Only this source (repeatable).", multiple=True)
@click.option("--role", multiple=True, type=click.Choice(ROLES, case_sensitive=False),
              help="Only this role (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@json_option("Print JSON for scripts.")
@with_store
def search_cmd(db: SessionDB, query: str, source: tuple[str, ...], role: tuple[str, ...], limit: int,
               as_json: bool) -> None:
    """Full-text search over every stored message (any text is accepted)."""
    results = db.search.messages(query, source_filter=list(source) or None, role_filter=list(role) or None,
                                 limit=limit)
    if as_json:
        _json_out(results)
        return
    if not results:
        click.echo("No matches.")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("When", no_wrap=True)
    table.add_column("Src", no_wrap=True)
    table.add_column("Role", no_wrap=True)
    table.add_column("Snippet", overflow="fold")
    table.add_column("Session", no_wrap=True, min_width=max(len(r["session_id"]) for r in results))
    for hit in results:
        table.add_row(relative_time(hit["timestamp"]), hit.get("source") or "", hit["role"],
                      highlighted(hit.get("snippet") or ""), hit["session_id"])
    _console().print(table)


@sessions.command("export")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@_source_option("Only sessions from this source.")
@click.option("--session-id", help="Only this session (id, prefix or title).")
@click.option("--force", is_flag=True, help="Replace FILE when it exists (refused otherwise).")
@with_store
def export_cmd(db: SessionDB, file: Path, source: str | None, session_id: str | None, force: bool) -> None:
    """Write sessions to FILE as JSON lines (one session with its messages per line; - for stdout)."""
    if str(file) != "-" and file.exists() and not force:
        raise click.ClickException(f"{file} already exists: nothing was written (pass --force to replace it)")
    wanted = _resolve(db, session_id, "nothing was written") if session_id else None
    if str(file) == "-":
        count = db.transfer.write_export(sys.stdout, source=source, session_id=wanted)
        click.echo(f"exported {plural(count, 'session')}", err=True)
        return
    partial = file.with_name(f".{file.name}.partial")
    try:
        # conversations are private: the file is readable by its owner only
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            count = db.transfer.write_export(handle, source=source, session_id=wanted)
        os.replace(partial, file)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {file}: {exc.strerror}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    click.echo(f"exported {plural(count, 'session')} to {file}")


@sessions.command("import")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option("--from-hermes", "hermes", metavar="STATE_DB",
              type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
              help="Import the sessions of a Hermes Agent state.db (read only, left as it is).")
@with_store
def import_cmd(db: SessionDB, file: Path | None, hermes: Path | None) -> None:
    """Restore sessions from an export FILE, or import a Hermes Agent state.db (--from-hermes); sessions
    already present are skipped, so running it again imports nothing twice."""
    if (file is None) == (hermes is None):
        raise click.UsageError("give an export FILE, or --from-hermes STATE_DB (one of the two)")
    if hermes is not None:
        found = read_hermes(hermes)
        result = db.transfer.import_sessions(found.records, taken_title_suffix=HERMES_TITLE_SUFFIX)
        click.echo(f"imported {plural(result['imported'], 'session')} ({plural(result['messages'], 'message')}) "
                   f"from Hermes Agent's {hermes} (schema v{found.version}); it was left unchanged")
        if found.left_out:
            click.echo(f"left out {plural(found.left_out, 'message')} Hermes no longer shows (rewound or replaced)")
    else:
        assert file is not None
        result = db.transfer.import_sessions(parse_jsonl(file))
        click.echo(f"imported {plural(result['imported'], 'session')} ({plural(result['messages'], 'message')}) "
                   f"from {file}")
    if result["skipped"]:
        shown = ", ".join(result["skipped"][:10]) + (" ..." if len(result["skipped"]) > 10 else "")
        click.echo(f"skipped {plural(len(result['skipped']), 'session')} already present: {shown}")


@sessions.command("delete")
@click.argument("ref")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@with_store
def delete_cmd(db: SessionDB, ref: str, yes: bool) -> None:
    """Delete the session with id or exact title REF, and its messages (its children are kept)."""
    session_id = _exactly(db, ref, "nothing was deleted")
    session = db.sessions.get(session_id)
    title, count = (session.title, session.message_count) if session is not None else (None, 0)
    label = f"{session_id}" + (f" ({title})" if title else "")
    _confirm(f"Delete session {label} and its {plural(count, 'message')}?", yes)
    doomed = db.media.of_sessions([session_id])
    if not db.sessions.delete(session_id):
        raise click.ClickException(f"session {session_id} no longer exists")
    click.echo(f"deleted {label}")
    forget_media(db, doomed)


@sessions.command("rename")
@click.argument("ref")
@click.argument("title", nargs=-1, required=True)
@with_store
def rename_cmd(db: SessionDB, ref: str, title: tuple[str, ...]) -> None:
    """Set the title of the session with id or exact title REF (words need no quotes)."""
    session_id = _exactly(db, ref, "nothing was renamed")
    db.titles.set(session_id, " ".join(title))
    new = db.titles.get(session_id)
    click.echo(f"{session_id} is now titled {new!r}" if new else f"{session_id} has no title now")


@sessions.command("prune")
@click.option("--older-than", "days", type=click.FloatRange(min=0), default=90, show_default=True,
              help="Days without activity.")
@_source_option("Only sessions from this source.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@with_store
def prune_cmd(db: SessionDB, days: float, source: str | None, yes: bool) -> None:
    """Delete ended sessions inactive for DAYS; children of a pruned session are kept."""
    candidates = db.sessions.prune_candidates(days, source)
    if not candidates:
        click.echo("Nothing to prune.")
        return
    _confirm(f"Delete {plural(len(candidates), 'ended session')} inactive for {days:g} days?", yes)
    doomed = db.media.of_sessions(candidates)
    click.echo(f"pruned {plural(db.sessions.prune(days, source), 'session')}")
    forget_media(db, doomed)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


@sessions.command("stats")
@json_option("Print JSON for scripts.")
@with_store
def stats_cmd(db: SessionDB, as_json: bool) -> None:
    """Counts by source, database and WAL size."""
    stats = db.transfer.stats()
    if as_json:
        _json_out(stats)
        return
    click.echo(f"Total sessions: {stats['sessions']}")
    click.echo(f"Total messages: {stats['messages']}")
    for source, count in stats["by_source"].items():
        click.echo(f"  {source}: {plural(count, 'session')}")
    click.echo(f"Database size: {_size(stats['db_bytes'])} (WAL {_size(stats['wal_bytes'])})")
    click.echo(f"Database: {stats['path']}")
