"""The sweeper: a session with unanswered messages that nothing would claim is claimed anyway, and logged.

The claims (tests/test_cluster_turns.py) answer every session marked pending when its message was
stored.  The sweeper is the second line behind them: a session left with unanswered messages, no
pending mark and no live lease (its instance died, it stored without the mark) is marked within a
sweep and claimed by whichever instance is alive, within ``cluster.lease_seconds`` + 5 s.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from state import SessionDB
from state.cluster import claim, claim_next, get_lease, sweep_stranded
from tests.clusterdaemons import health, instance_dir, instance_settings
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually


def _where(chat: str, message_id: str) -> dict:
    return {"session_key": f"agent:main:telegram:dm:{chat}", "platform": "telegram", "chat_id": chat,
            "chat_type": "dm", "user_id": chat, "platform_message_id": message_id}


def _strand(db: SessionDB, conn: psycopg.Connection, session_id: str, chat: str, text: str) -> None:
    """A session as a dead instance leaves it: a message stored and unanswered, no pending mark, and the
    dead instance's lease on it expired."""
    db.sessions.create(session_id, "telegram", session_key=f"agent:main:telegram:dm:{chat}", user_id=chat)
    db.routes.set(f"agent:main:telegram:dm:{chat}", session_id)
    db.messages.append_inbound(session_id, text, platform_message_id=f"{session_id}-1", inbox=_where(chat, f"{session_id}-1"))
    assert claim(conn, session_id, "dead-instance", 0.05) is not None
    time.sleep(0.1)  # its lease runs out; the instance never released it


def test_the_sweeper_marks_only_sessions_nothing_would_claim(pg_url):
    with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as conn:
        _strand(db, conn, "stranded", "1", "lost one")
        db.sessions.create("held", "telegram")  # a live lease: its holder answers it
        db.messages.append_inbound("held", "mine", platform_message_id="h-1", inbox=_where("2", "h-1"))
        assert claim(conn, "held", "alive-instance", 60) is not None
        db.sessions.create("queued", "telegram")  # marked when stored: the claims take it anyway
        db.messages.append_inbound("queued", "q", platform_message_id="q-1", inbox=_where("3", "q-1"), pending=True)
        db.sessions.create("answered", "telegram")  # nothing unanswered
        db.sessions.create("elsewhere", "discord")  # a platform this instance does not answer
        db.messages.append_inbound("elsewhere", "d", platform_message_id="d-1",
                          inbox={**_where("4", "d-1"), "platform": "discord"})

        found = sweep_stranded(conn, ["telegram"])
        assert [(s.session_id, s.messages) for s in found] == [("stranded", 1)]
        assert sweep_stranded(conn, ["telegram"]) == []  # marked once: now the claims' work
        assert get_lease(conn, "held").holder == "alive-instance"
        claimed = {claim_next(conn, "survivor", 15).session_id, claim_next(conn, "survivor", 15).session_id}
        assert claimed == {"stranded", "queued"}
        assert claim_next(conn, "survivor", 15) is None


async def test_a_stranded_session_is_answered_by_the_live_instance_within_the_lease_and_five_seconds(tmp_path, pg_url):
    lease_seconds = 3
    async with FakeTelegram() as tg, FakeModel() as model:
        side = TelegramSide(tg)
        daemon = Daemon(instance_dir(tmp_path, "a"), instance_settings(
            pg_url, "a", model.base_url, cluster={"lease_seconds": lease_seconds}, **side.settings()))
        try:
            start = await daemon.start()
            await side.ready(start, 30.0)

            def strand() -> float:
                with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as conn:
                    _strand(db, conn, "stranded", side.chat_of(0), "are you there")
                return time.monotonic()

            stranded_at = await asyncio.to_thread(strand)  # while the instance runs: its start saw nothing
            answer = await eventually(
                lambda: next((r for r in side.replies() if r.chat == side.chat_of(0)), None),
                lease_seconds + 5.0, "the stranded message answered within cluster.lease_seconds + 5 s", every=0.05)
            waited = time.monotonic() - stranded_at
            shown = await health(daemon)
            await daemon.stop()
        finally:
            if daemon.proc is not None and daemon.proc.returncode is None:
                await daemon.kill()
    print(f"\nstranded session answered {waited:.2f}s after it was left (bound {lease_seconds + 5}s)")
    assert "are you there" in answer.text
    assert len([r for r in side.replies() if r.chat == side.chat_of(0)]) == 1
    assert shown["cluster"]["claims"]["swept"] == 1
    logged = [line for line in daemon.log_path(0).read_text().splitlines() if "sweeper: session stranded" in line]
    assert logged and " WARNING " in logged[0] and "1 unanswered message(s)" in logged[0], logged
