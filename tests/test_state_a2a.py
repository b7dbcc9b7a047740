"""The A2A tasks' table (``state._a2a``, schema v34) on both engines: a task ends once, a push is taken by
one sender per try and comes due again when its sender died mid-try."""

from __future__ import annotations

NOW = 1_764_633_600.0


def _task(store, task_id: str, *, created: float = NOW, push: bool = False) -> None:
    assert store.a2a.add({"id": task_id, "caller": "planner", "context_id": "ctx", "session_key": "agent:main:a2a:planner:ctx",
                          "request": f"asked {task_id}", "created_at": created,
                          "push_url": "https://planner.example/push" if push else None,
                          "push_token": "tok" if push else None})


def test_a_task_ends_once_and_a_second_add_of_its_id_writes_nothing(store):
    _task(store, "t1")
    assert store.a2a.add({"id": "t1", "caller": "other", "context_id": "c", "session_key": "k", "request": "x",
                          "created_at": NOW}) is False
    assert store.a2a.end("t1", "canceled", now=NOW + 1) is True
    assert store.a2a.end("t1", "completed", answer="late answer", now=NOW + 2) is False
    row = store.a2a.get("t1")
    assert (row["caller"], row["state"], row["answer"], row["updated_at"]) == ("planner", "canceled", None, NOW + 1)
    assert row["push_due"] is None  # no push URL: nothing to send


def test_the_working_tasks_of_a_session_asked_before_one_are_listed_in_order(store):
    for i, created in enumerate((NOW, NOW + 1, NOW + 2)):
        _task(store, f"t{i}", created=created)
    store.a2a.end("t0", "completed", answer="a", now=NOW + 3)
    assert store.a2a.working_before("agent:main:a2a:planner:ctx", NOW + 1) == ["t1"]
    assert store.a2a.working_before("agent:main:a2a:planner:ctx", NOW + 2) == ["t1", "t2"]
    assert [r["id"] for r in store.a2a.in_context("planner", "ctx", 2)] == ["t1", "t2"]
    assert store.a2a.in_context("other", "ctx") == []


def test_a_push_is_due_when_its_task_ends_and_taken_by_one_sender_per_try(store):
    _task(store, "p1", push=True)
    assert store.a2a.due_pushes(NOW + 10) == []  # working: nothing to tell yet
    store.a2a.end("p1", "completed", answer="done", now=NOW + 1)
    [due] = store.a2a.due_pushes(NOW + 1)
    assert (due["id"], due["push_due"], due["push_attempts"]) == ("p1", NOW + 1, 0)
    assert store.a2a.take_push("p1", due["push_due"], NOW + 20) is True
    assert store.a2a.take_push("p1", due["push_due"], NOW + 20) is False  # another sender saw it due too
    assert store.a2a.due_pushes(NOW + 5) == []  # taken: due again only once its try has had its time
    [again] = store.a2a.due_pushes(NOW + 20)  # the sender died mid-try
    assert again["push_attempts"] == 1
    store.a2a.settle_push("p1", None, "given up after 1 tries: HTTP 410")
    assert store.a2a.due_pushes(NOW + 1000) == []
    assert store.a2a.get("p1")["push_error"] == "given up after 1 tries: HTTP 410"


def test_a_task_that_never_started_is_forgotten_but_an_ended_one_is_kept(store):
    _task(store, "f1")
    _task(store, "f2")
    store.a2a.end("f2", "failed", error="model down", now=NOW)
    store.a2a.forget("f1")
    store.a2a.forget("f2")
    assert store.a2a.get("f1") is None
    assert store.a2a.get("f2")["error"] == "model down"
