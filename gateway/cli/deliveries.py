"""``switchboard deliveries``: the delivery record, newest first, with what each platform said of it.

Every reply is recorded before it is sent (``pending``), then ``sent`` with its parts' ids, or
``failed`` with the reason.  A platform that reports back (WhatsApp's statuses) adds the receipt:
``delivered`` to the phone, ``read`` by the person, or ``failed`` with the platform's code, as late
as days after the send (a phone that was off).  A thin layer: open the store, call one method, print.
"""

from __future__ import annotations

import click
from rich.table import Table

from gateway.cli.common import InstalledChoice, console, json_option, json_out, when, with_store
from gateway.platforms import installed_platforms
from state import AmbiguousSession, SessionDB


@click.group("deliveries")
def deliveries() -> None:
    """The replies sent (or not) and what each platform said became of them: delivered, read, failed."""


@deliveries.command("list")
@click.option("--platform", type=InstalledChoice(installed_platforms), default=None, help="Only this platform's.")
@click.option("--session", "session_ref", default=None, metavar="REF",
              help="Only this session's (an id, a unique id prefix, or a title).")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@json_option("Print JSON for scripts.")
@with_store
def list_cmd(db: SessionDB, platform: str | None, session_ref: str | None, limit: int, as_json: bool) -> None:
    """Replies, newest first: when, where, our send's state, the platform's receipt and why one failed."""
    session_id = None
    if session_ref is not None:
        try:
            session_id = db.sessions.resolve_id(session_ref)
        except AmbiguousSession as exc:
            raise click.ClickException(f"{exc}; see: switchboard sessions list") from None
    rows = db.receipts.deliveries(platform=platform and platform.lower(), session_id=session_id, limit=limit)
    if as_json:
        json_out(rows)
        return
    if not rows:
        click.echo("No deliveries recorded.")
        return
    table = Table(box=None, header_style="bold")
    for name in ("When", "Platform", "Chat", "Parts", "Send", "Receipt"):
        table.add_column(name, no_wrap=True)
    table.add_column("Reason", max_width=64, overflow="ellipsis", no_wrap=True)
    table.add_column("Reply", max_width=24, overflow="ellipsis", no_wrap=True)
    for row in rows:
        reason = row.get("receipt_error") or row.get("error") or ""
        table.add_row(when(row["created_at"]), row["platform"], row["chat_id"], str(len(row["sent_ids"])),
                      row["status"], row.get("receipt") or "-", reason.replace("\n", " "),
                      (row.get("text") or "").replace("\n", " "))
    console().print(table)
