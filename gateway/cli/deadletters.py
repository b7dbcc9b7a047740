"""``switchboard deadletters``: list, show, retry, drop the events the daemon set aside.

An event whose handling failed three times is kept in state.db's
``dead_letters`` table (its payload with every secret masked) so the chat
could move on.  ``retry`` marks one for replay: the running daemon hands the
stored message to the gateway again within a few seconds (or at its next
start).  A thin layer: open the store, call one ``SessionDB`` method, print.
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from gateway.cli.common import console as _console, json_option, json_out as _json_out, when as _when, with_store
from state import SessionDB

STATUSES = ("held", "retry", "retried", "dropped")
def _get(db: SessionDB, dead_letter_id: int) -> dict:
    row = db.dead_letters.get(dead_letter_id)
    if row is None:
        raise click.ClickException(f"there is no dead letter {dead_letter_id} (see: switchboard deadletters list)")
    return row


def _decoded(row: dict) -> dict:
    """The row with its payload and message as JSON values (for --json)."""
    out = dict(row)
    for column in ("payload", "message"):
        if out.get(column):
            try:
                out[column] = json.loads(out[column])
            except ValueError:
                pass
    return out


@click.group("deadletters")
def deadletters() -> None:
    """Events set aside after failing three times: look at them, replay them after a fix, or drop them."""


@deadletters.command("list")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="Only dead letters in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@json_option("Print JSON for scripts.")
@with_store
def list_cmd(db: SessionDB, status: str | None, limit: int, as_json: bool) -> None:
    """Dead letters, newest first: id, platform, event, state, attempts, last error."""
    rows = db.dead_letters.list(status=status, limit=limit)
    if as_json:
        _json_out([_decoded(r) for r in rows])
        return
    if not rows:
        click.echo("No dead letters." if status is None else f"No dead letters in state {status}.")
        return
    table = Table(box=None, header_style="bold")
    for name in ("ID", "Platform", "Event", "State", "Tries", "When"):
        table.add_column(name, no_wrap=True)
    table.add_column("Last error", max_width=60, overflow="ellipsis", no_wrap=True)
    for row in rows:
        table.add_row(str(row["id"]), row["platform"], row.get("event_id") or "-", row["status"], str(row["attempts"]),
                      _when(row["updated_at"]), row["error"].replace("\n", " "))
    _console().print(table)


@deadletters.command("show")
@click.argument("dead_letter_id", metavar="ID", type=int)
@json_option("Print the dead letter as JSON.")
@with_store
def show_cmd(db: SessionDB, dead_letter_id: int, as_json: bool) -> None:
    """One dead letter: its error and the event as the platform sent it (secrets masked)."""
    row = _decoded(_get(db, dead_letter_id))
    if as_json:
        _json_out(row)
        return
    message = row.get("message")
    click.echo("\n".join([
        f"Dead letter {row['id']}",
        f"Platform    {row['platform']}  event {row.get('event_id') or '-'}",
        f"State       {row['status']} after {row['attempts']} failed attempts",
        f"First       {_when(row['created_at'])}",
        f"Last        {_when(row['updated_at'])}",
        f"Error       {row['error']}",
        "Replay      " + (f"possible: the message from {message.get('user_name') or message.get('user_id')} in chat "
                          f"{message.get('chat_id')} is kept" if isinstance(message, dict)
                          else "not possible: it failed before it was read into a message"),
        "",
        "Payload (secrets masked):",
    ]))
    payload = row["payload"]
    click.echo(json.dumps(payload, ensure_ascii=False, indent=2) if not isinstance(payload, str) else payload)


@deadletters.command("retry")
@click.argument("dead_letter_id", metavar="ID", type=int)
@with_store
def retry_cmd(db: SessionDB, dead_letter_id: int) -> None:
    """Have the running daemon hand the stored message to the gateway again (after fixing the cause)."""
    row = _get(db, dead_letter_id)
    if not row.get("message"):
        raise click.ClickException(
            f"dead letter {dead_letter_id} cannot be replayed: it failed before it was read into a message, so "
            f"there is no message to hand to the gateway again. Look at its payload with: switchboard deadletters "
            f"show {dead_letter_id}; set it aside for good with: switchboard deadletters drop {dead_letter_id}")
    if row["status"] == "retry":
        click.echo(f"dead letter {dead_letter_id} is already marked for retry; the running daemon replays it "
                   "within a few seconds")
        return
    if not db.dead_letters.set_status(dead_letter_id, "retry", only_from=("held", "dropped")):
        raise click.ClickException(f"dead letter {dead_letter_id} was already replayed "
                                   f"({_when(row['updated_at'])}); nothing to do")
    click.echo(f"dead letter {dead_letter_id} is marked for retry: the running daemon replays it within a few "
               f"seconds (or when it next starts); see the outcome with: switchboard deadletters show {dead_letter_id}")


@deadletters.command("drop")
@click.argument("dead_letter_id", metavar="ID", type=int)
@with_store
def drop_cmd(db: SessionDB, dead_letter_id: int) -> None:
    """Give up on a dead letter: it is kept, marked dropped, and no longer counted."""
    row = _get(db, dead_letter_id)
    if row["status"] == "dropped":
        click.echo(f"dead letter {dead_letter_id} was already dropped")
        return
    if not db.dead_letters.set_status(dead_letter_id, "dropped", only_from=("held", "retry")):
        raise click.ClickException(f"dead letter {dead_letter_id} was already replayed; there is nothing to drop")
    click.echo(f"dead letter {dead_letter_id} dropped")
