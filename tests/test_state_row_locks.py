"""Writes that read what they then change, racing from two store instances (two daemons on one
PostgreSQL store, whose writes run at READ COMMITTED with row and advisory locks: state/_pg.py).

Each race would lose an update, break a uniqueness or fail with a constraint error if the lock it
relies on were missing; on SQLite the same races run through two SessionDB on one file, whose
writes always take turns.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from state import SessionDB, TitleConflict
from state._routes import set_route

THREADS = 4


@pytest.fixture
def two(store_target):
    """Two stores on one target: two instances."""
    first, second = SessionDB(store_target), SessionDB(store_target)
    yield first, second
    first.close()
    second.close()


def race(count: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(n)`` on ``count`` threads released together; what each returned or raised, in n's order."""
    gate = threading.Barrier(count, timeout=30)
    results: list[Any] = [None] * count

    def run(n: int) -> None:
        gate.wait()
        try:
            results[n] = work(n)
        except Exception as exc:  # noqa: BLE001 - the test asserts on what was raised
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a writer is stuck"
    return results


def test_appends_to_one_session_from_two_instances_keep_every_message_and_its_order(two):
    a, b = two
    a.sessions.create("s1", "api")
    per_writer = 15

    def write(n: int) -> None:
        db = (a, b)[n % 2]
        for i in range(per_writer):
            db.messages.append("s1", "user", f"w{n} {i:02d}")

    assert race(THREADS, write) == [None] * THREADS
    contents = [m.content for m in b.messages.get("s1")]
    assert len(contents) == THREADS * per_writer
    for n in range(THREADS):  # each writer's messages in the order it wrote them
        own = [c for c in contents if c.startswith(f"w{n} ")]
        assert own == [f"w{n} {i:02d}" for i in range(per_writer)]
    assert a.sessions.get("s1").message_count == THREADS * per_writer


def test_turns_recorded_from_two_instances_follow_what_each_answered(two):
    a, b = two
    a.sessions.create("s1", "api")
    asked = [a.messages.append("s1", "user", f"q{n}") for n in range(THREADS)]

    def answer(n: int) -> list[int]:
        return (a, b)[n % 2].messages.record_turn(
            "s1", [{"role": "assistant", "content": f"a{n}"}], input_tokens=10, output_tokens=1,
            answered=[asked[n]])

    results = race(THREADS, answer)
    assert all(isinstance(r, list) for r in results), results
    contents = [m.content for m in a.messages.get("s1")]
    assert contents == [text for n in range(THREADS) for text in (f"q{n}", f"a{n}")]
    row = b.sessions.get("s1")
    assert (row.message_count, row.input_tokens, row.output_tokens) == (2 * THREADS, 10 * THREADS, THREADS)


def test_one_title_given_to_two_sessions_at_once_goes_to_one_and_the_other_is_told(two):
    a, b = two
    for n in range(THREADS):
        a.sessions.create(f"s{n}", "api")
    results = race(THREADS, lambda n: (a, b)[n % 2].titles.set(f"s{n}", "Plans"))
    assert sorted(type(r).__name__ for r in results) == ["TitleConflict"] * (THREADS - 1) + ["bool"]
    holder = next(f"s{n}" for n, r in enumerate(results) if r is True)
    assert all(r.holder_session_id == holder for r in results if isinstance(r, TitleConflict))
    assert [n for n in range(THREADS) if a.titles.get(f"s{n}") == "Plans"] == [int(holder[1:])]


def test_one_session_created_by_two_instances_at_once_is_made_once(two):
    a, b = two
    results = race(THREADS, lambda n: (a, b)[n % 2].sessions.create("same", "telegram", user_id=f"u{n}"))
    assert results == ["same"] * THREADS
    assert a.sessions.count() == 1


def test_a_route_moved_to_a_session_being_deleted_never_points_at_nothing(two):
    a, b = two
    for round_ in range(6):
        target = f"t{round_}"
        a.sessions.create(target, "api")
        results = race(2, lambda n, t=target: a.routes.set("chat", t) if n == 0 else b.sessions.delete(t))
        assert not any(isinstance(r, Exception) and not type(r).__name__ == "SessionNotFound" for r in results), results
        route = b.routes.get("chat")
        if route == target:
            assert b.sessions.get(target) is not None
        else:
            assert b.sessions.get(target) is None


def test_appends_racing_a_delete_either_go_with_it_or_find_no_session(two):
    a, b = two
    for round_ in range(6):
        sid = f"d{round_}"
        a.sessions.create(sid, "api")
        results = race(2, lambda n, s=sid: a.messages.append(s, "user", "hi") if n == 0 else b.sessions.delete(s))
        assert results[1] is True
        assert results[0] is None or isinstance(results[0], int) or type(results[0]).__name__ == "SessionNotFound", \
            results
        assert b.messages.count(sid) == 0 and b.sessions.get(sid) is None


def test_token_counters_added_from_two_instances_lose_nothing(two):
    a, b = two
    a.sessions.create("s1", "api")

    def add(n: int) -> None:
        for _ in range(10):
            (a, b)[n % 2].sessions.update_token_counts("s1", input_tokens=3, output_tokens=1)

    race(THREADS, add)
    row = a.sessions.get("s1")
    assert (row.input_tokens, row.output_tokens) == (30 * THREADS, 10 * THREADS)


def test_pairing_requests_from_two_instances_stop_at_the_limit(two):
    a, b = two
    results = race(THREADS, lambda n: (a, b)[n % 2].pairing.request(
        "telegram", f"u{n}", None, f"CODE{n}", now=1000.0, ttl=3600, max_pending=2))
    assert sum(r is not None for r in results) == 2, results
    assert len(a.pairing.list(now=1000.0)["pending"]) == 2


def test_a_question_answered_from_two_instances_at_once_ends_once_with_one_answer(two):
    a, b = two
    for round_ in range(4):
        qid = f"q{round_}"
        a.questions.add({"id": qid, "platform": "telegram", "chat_id": "42", "tool": "book", "field": "date",
                         "kind": "text", "choices": "[]", "asked_at": 1000.0, "expires_at": 2000.0})
        results = race(THREADS, lambda n, q=qid: (a, b)[n % 2].questions.close(
            q, "answered" if n else "expired", answer=f'"{n}"', by=f"u{n}", now=1001.0))
        assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
        winner = results.index(True)
        row = b.questions.get(qid)
        assert (row["status"], row["answer"], row["answered_by"]) == (
            "answered" if winner else "expired", f'"{winner}"', f"u{winner}")


def test_a_round_sent_again_from_two_instances_at_once_is_sent_once(two):
    """A call cut off mid-question is sent again with its answers by one run only (db.questions.resend)."""
    a, b = two
    for n in range(3):
        a.questions.add({"id": f"r{n}", "platform": "telegram", "chat_id": "42", "tool": "echo__book", "field": "city",
                         "kind": "choice", "choices": "[]", "asked_at": 1000.0 + n, "expires_at": 2000.0,
                         "session_id": "s", "call_id": "call_1", "round_id": "round-a" if n < 2 else "round-b",
                         "retry": "{}"})
    assert b.questions.rounds_of_call("s", "call_1") == ["round-a", "round-b"]
    assert b.questions.rounds_of_call("s", "call_2") == []
    results = race(THREADS, lambda n: (a, b)[n % 2].questions.resend("round-a", now=1500.0))
    assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
    assert [r["resent_at"] for r in b.questions.of_round("round-a")] == [1500.0, 1500.0]
    assert b.questions.of_round("round-b")[0]["resent_at"] is None
    assert not a.questions.resend("no-such-round", now=1500.0)


def test_a_read_of_several_statements_sees_one_moment_while_another_instance_writes(two):
    """Reads of one statement run without a transaction on PostgreSQL (state/_pg.py); one that runs a
    second statement must still see a single snapshot, even when its first try began without one."""
    a, b = two
    a.sessions.create("s1", "api")
    written = iter(range(100))

    def counted_twice(conn) -> tuple[int, int]:
        before = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = $1", ("s1",)).fetchone()[0]
        b.messages.append("s1", "user", f"meanwhile {next(written)}")  # committed by the other instance
        after = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = $1", ("s1",)).fetchone()[0]
        return before, after

    for _ in range(3):  # the first time, and once the store knows this read runs two statements
        before, after = a._engine.read(counted_twice)
        assert before == after, "the read's two statements saw two moments"
    assert a.messages.count("s1") >= 3


def test_one_a2a_task_added_by_two_instances_at_once_is_started_once(two):
    a, b = two
    for round_ in range(4):
        results = race(THREADS, lambda n, r=round_: (a, b)[n % 2].a2a.add(
            {"id": f"t{r}", "caller": f"caller{n}", "context_id": "ctx", "session_key": "k", "request": "hi",
             "created_at": 1000.0}))
        assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
        assert b.a2a.get(f"t{round_}")["caller"] == f"caller{results.index(True)}"


def test_one_signed_request_claimed_by_two_instances_at_once_is_taken_once(two):
    a, b = two
    for round_ in range(4):
        results = race(THREADS, lambda n, r=round_: (a, b)[n % 2].replays.claim(
            "webhook:hook", f"sig{r}", keep_until=2000.0, held_until=1030.0, now=1000.0))
        assert results.count("taken") == 1 and results.count("in_flight") == THREADS - 1, results


def test_a_message_coming_while_its_route_moves_goes_where_the_route_points_once_moved(two):
    """The routed append locks the route's row and its session's (state._messages.routed_session_locked): one
    that waits for a move of the route to commit stores the message in the session moved to."""
    a, b = two
    for sid in ("old", "new"):
        a.sessions.create(sid, "telegram", session_key="chat")
    a.routes.set("chat", "old")
    stored: dict[str, Any] = {}

    def move_while_a_message_comes(conn) -> threading.Thread:
        set_route(conn, "chat", "new")
        coming = threading.Thread(target=lambda: stored.update(
            result=b.messages.append_inbound_to_route("chat", "hi", platform_message_id="m1")))
        coming.start()
        time.sleep(0.5)  # the other instance's append waits for this move to commit
        return coming

    a._engine.write(move_while_a_message_comes).join(30)
    session, appended = stored["result"]
    assert session["id"] == "new" and appended.new
    assert [m.content for m in a.messages.get("new")] == ["hi"] and a.messages.get("old") == []
