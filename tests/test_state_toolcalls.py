"""The tool-call journal (state._toolcalls) on both engines: kept under a turn's last message, found by
any message a resumed turn answers, dropped with the turn or with its session."""

from __future__ import annotations


def test_a_journal_is_found_by_any_answered_message_and_goes_with_its_session(store):
    store.sessions.create("s", "telegram")
    first = store.messages.append("s", "user", "run the slow job")
    later = store.messages.append("s", "user", "are you there?")
    store.tool_journal.save(first, "s", '[{"role": "assistant"}]', "call-1", now=100.0)
    store.tool_journal.save(first, "s", '[{"role": "assistant"}, {"role": "tool"}]', None, now=101.0)
    assert store.tool_journal.newest([later]) is None
    assert store.tool_journal.newest([first, later]) == {"message_id": first, "session_id": "s", "running": None,
                                                  "produced": '[{"role": "assistant"}, {"role": "tool"}]',
                                                  "updated_at": 101.0}
    store.tool_journal.drop([first, later])
    assert store.tool_journal.newest([first]) is None
    store.tool_journal.save(later, "s", "[]", "call-2", now=102.0)
    assert store.sessions.delete("s")
    assert store.tool_journal.newest([later]) is None


def test_a_cron_jobs_tools_are_stored_and_edited(store):
    job = {"id": "j", "name": "j", "schedule": "every 1d", "prompt": "p", "deliver": "local", "model": None,
           "context": "fresh", "grace_seconds": 60.0, "tools": "files__read_* search__query"}
    assert store.cron.add_job(job, source="config", now=1.0, next_run_at=2.0)["tools"] == "files__read_* search__query"
    assert store.cron.update_job("j", {"tools": None}, now=3.0, next_run_at="keep")["tools"] is None
