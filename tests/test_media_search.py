"""A document's text is found by the searches people use, ranked with the messages' own text (#32 item 5).

Every test runs on SQLite and PostgreSQL (``store``/``store_target``, tests/conftest.py): the text is
stored once in ``message_media`` and searched through the engine's index over it (schema v30).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from tests.fakes.model_server import FakeModel, ToolCall
from tests.harness import ApiClient, running_gateway

FILLER = ("the weekly standup moved to thursday", "remember to water the basil", "invoice 42 is paid",
          "the printer on floor two is jammed again", "risotto needs twenty minutes", "the cat ignored dinner")


def _document(text: str, name: str = "manual.pdf", sha: str = "d") -> dict:
    return {"sha256": sha * 64, "name": name, "mime": "application/pdf", "size": len(text), "kind": "document",
            "text": text}


def _session(store, sid: str, user: str, said: str, files: list[dict] = ()) -> int:
    store.sessions.create(sid, "api", user_id=user, session_key=f"agent:main:api:dm:{user}")
    sent = store.messages.append_inbound(sid, said, platform_message_id="1")
    if files:
        store.media.attach(sent.id, list(files))
    return sent.id


def _cli_search(backend: str, store_target, tmp_path: Path, query: str) -> list[dict]:
    """``switchboard sessions search QUERY --json`` on this test's store."""
    args = ["sessions", "search", query, "--json"]
    if backend != "sqlite":
        config = tmp_path / "config.yaml"
        config.write_text(json.dumps({"store": {"url": store_target}}))
        args += ["--config", str(config)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _sessions(hits: list[dict]) -> list[str]:
    return [h["session_id"] for h in hits]


def test_a_word_only_in_a_document_finds_its_session(store, backend, store_target, tmp_path):
    _session(store, "pdf", "alice", "[attached document: manual.pdf]",
             [_document("Chapter 3. The zeppelin mooring mast must be inspected before each flight.")])
    _session(store, "chat", "alice", "what is a mooring line?")
    hits = _cli_search(backend, store_target, tmp_path, "zeppelin")
    assert _sessions(hits) == ["pdf"]
    assert hits[0]["snippet"].startswith("[manual.pdf] ") and ">>>zeppelin<<<" in hits[0]["snippet"]
    # both ways: the word in the file, the other in a message, each found
    assert sorted(_sessions(_cli_search(backend, store_target, tmp_path, "mooring"))) == ["chat", "pdf"]
    # recall (session_search) in the operator's scope, the user's own, and another user's
    every = store.recall.hits("zeppelin", agent_prefix=None, accounts=None)["hits"]
    assert [(h["session_id"], h["conversation"]) for h in every] == [("pdf", "pdf")]
    assert _sessions(store.recall.hits("zeppelin", agent_prefix="agent:main:", accounts=["api:alice"])["hits"]) == ["pdf"]
    assert store.recall.hits("zeppelin", agent_prefix="agent:main:", accounts=["api:bob"])["hits"] == []
    # the query language is the search's: a NOT leaves it out, a prefix finds it
    assert _sessions(_cli_search(backend, store_target, tmp_path, "mooring NOT zeppelin")) == ["chat"]
    assert _sessions(_cli_search(backend, store_target, tmp_path, "zeppel*")) == ["pdf"]
    assert [h["name"] for h in store.media.search("ZEPPELIN mast")] == ["manual.pdf"]


def test_a_deleted_sessions_document_no_longer_matches(store, backend, store_target, tmp_path):
    text = "Hangar rota: the airship crew rotates every fortnight."
    _session(store, "doomed", "alice", "[attached document: rota.pdf]", [_document(text, "rota.pdf")])
    _session(store, "kept", "bob", "[attached document: rota.pdf]", [_document(text, "rota.pdf")])
    assert _sessions(_cli_search(backend, store_target, tmp_path, "airship")) == ["kept", "doomed"]
    store.sessions.delete("doomed")
    assert _sessions(_cli_search(backend, store_target, tmp_path, "airship")) == ["kept"]
    assert _sessions(store.recall.hits("airship", agent_prefix=None, accounts=None)["hits"]) == ["kept"]
    assert store.recall.hits("airship", agent_prefix=None, accounts=["api:alice"])["hits"] == []
    store.sessions.delete("kept")
    assert _cli_search(backend, store_target, tmp_path, "airship") == []
    if backend == "sqlite":  # the index itself kept in step (PostgreSQL's goes with its rows)
        with closing(sqlite3.connect(store_target)) as conn:
            assert conn.execute("SELECT count(*) FROM media_fts WHERE media_fts MATCH 'airship'").fetchone() == (0,)
            conn.execute("INSERT INTO media_fts(media_fts) VALUES ('integrity-check')")


def test_files_and_messages_are_ranked_together_the_better_match_first(store, backend, store_target, tmp_path):
    for n, line in enumerate(FILLER):
        _session(store, f"filler-{n}", "carol", line,
                 [_document(f"appendix {n}: {line}", f"appendix{n}.pdf", sha=str(n))] if n < 3 else [])
    padding = " ".join(FILLER)
    _session(store, "doc-best", "carol", "[attached document: timetable.pdf]",
             [_document("Zeppelin timetable: the zeppelin leaves at nine, the zeppelin lands at noon.",
                        "timetable.pdf")])
    _session(store, "chat-long", "carol", f"{padding} and somewhere in all that a zeppelin flew over. {padding}")
    _session(store, "chat-best", "carol", "zeppelin! zeppelin zeppelin zeppelin")
    _session(store, "doc-long", "carol", "[attached document: minutes.pdf]",
             [_document(f"{padding} Item 7: a zeppelin was mentioned once. {padding}", "minutes.pdf", sha="e")])
    order = _sessions(_cli_search(backend, store_target, tmp_path, "zeppelin"))
    assert sorted(order) == ["chat-best", "chat-long", "doc-best", "doc-long"]
    # the short document saying it three times outranks a long message saying it once, and the
    # short message outranks the long document: one ranking, not files after messages
    assert order.index("doc-best") < order.index("chat-long")
    assert order.index("chat-best") < order.index("doc-long")
    assert order[-1] in ("chat-long", "doc-long")
    ranked = store.recall.hits("zeppelin", agent_prefix=None, accounts=None)["hits"]
    assert _sessions(ranked) == order


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        fake.responder = lambda messages: (f"tool said: {messages[-1]['content']}"
                                           if messages[-1].get("role") == "tool" else None)
        yield fake


async def test_the_model_finds_a_document_through_session_search(tmp_path, model, backend, store_target):
    overrides = {} if backend == "sqlite" else {"store": {"url": store_target}}
    async with running_gateway(tmp_path, model, **overrides) as gw:
        await gw.db.sessions.create("old-pdf", "api", model="m", user_id="dana", session_key="agent:main:api:dm:dana",
                                    title="Lease")
        sent = await gw.db.messages.append_inbound("old-pdf", "[attached document: lease.pdf]",
                                                   platform_message_id="1")
        await gw.db.media.attach(sent.id, [_document("The tenant may keep one ferret on the premises.", "lease.pdf")])
        model.script(ToolCall("session_search", {"query": "ferret"}))
        api = ApiClient(gw)
        answer = await api.say("dana", "what did my lease say about pets? the ferret one")
        await api.close()
    assert answer.startswith('tool said: Earlier conversations about "ferret" (1):')
    assert "session old-pdf" in answer
