import pytest

from state import new_session_id


def test_record_turn_stores_messages_and_usage_together(store):
    with store as db:
        sid = db.sessions.create(new_session_id(), "api", session_key="k")
        db.routes.set("k", sid)
        db.messages.append(sid, "user", "hi")
        ids = db.messages.record_turn(sid, [{"role": "assistant", "content": "hello"}], input_tokens=12, output_tokens=3)
        session = db.routes.session("k")
        assert len(ids) == 1
        assert (session["id"], session["input_tokens"], session["output_tokens"], session["message_count"]) == (sid, 12, 3, 2)
        assert db.routes.session("nowhere") is None


def test_a_failing_turn_record_leaves_nothing(store):
    with store as db:
        sid = db.sessions.create(new_session_id(), "api")
        with pytest.raises(ValueError):
            db.messages.record_turn(sid, [{"role": "assistant", "content": "ok"}, {"content": "no role"}], input_tokens=5)
        assert db.messages.get(sid) == []
        assert db.sessions.get(sid).input_tokens == 0


def test_an_inbound_message_is_stored_in_the_routed_session_in_one_call(store):
    with store as db:
        assert db.messages.append_inbound_to_route("k", "hello?", platform_message_id="m0") == (None, None)  # no route yet
        sid = db.sessions.create(new_session_id(), "telegram", session_key="k")
        db.routes.set("k", sid)

        session, appended = db.messages.append_inbound_to_route("k", "hi", platform_message_id="m1")
        assert session["id"] == sid and appended.new
        again = db.messages.append_inbound_to_route("k", "hi", platform_message_id="m1")[1]  # the platform redelivers
        assert (again.id, again.new) == (appended.id, False)

        seen = []
        session, appended = db.messages.append_inbound_to_route("k", "stale?", platform_message_id="m2",
                                                       keep=lambda row: seen.append(row["id"]) or False)
        assert (session["id"], appended, seen) == (sid, None, [sid])  # turned down: nothing written
        db.sessions.end(sid, "user_exit")
        session, appended = db.messages.append_inbound_to_route("k", "after the end", platform_message_id="m3")
        assert session["ended_at"] is not None and appended is None
        assert [m.content for m in db.messages.get(sid)] == ["hi"]


def test_a_requests_message_is_stored_and_its_turns_context_read_in_one_call(store):
    """db.turns.store_then_context: the message stored where the route points, then the turn's context read
    for it in the same transaction, as db.turns.context reads it after the store; nothing read when nothing
    new was stored."""
    from state import ContextQuery, FactsOwner

    with store as db:
        query = ContextQuery("", conversation=True, started=True, media=True, journal=(0,),
                             facts=FactsOwner("k", "main", "api:u1"), prefs=("k", ("model",)))
        assert db.turns.store_then_context("k", "hello?", query, platform_message_id=None) == (None, None, None)
        sid = db.sessions.create(new_session_id(), "api", session_key="k")
        db.routes.set("k", sid)
        db.messages.append(sid, "user", "earlier")
        db.messages.append(sid, "assistant", "an answer")
        db.prefs.set("k", "model", "fast", now=6.0)

        session, appended, context = db.turns.store_then_context("k", "and now?", query, platform_message_id="m1")
        assert session["id"] == sid and appended.new
        assert [m["content"] for m in context.conversation] == ["earlier", "an answer", "and now?"]
        after = db.turns.context(query.for_stored(sid, appended.id))  # the same query, read on its own
        assert (context.conversation, context.started_at, context.media, context.journal, context.facts,
                context.prefs) == (after.conversation, after.started_at, after.media, after.journal, after.facts,
                                   after.prefs)
        assert context.started_at == db.sessions.get(sid).started_at and context.pref("model") == "fast"
        assert (context.session_id, context.asked.upto, context.asked.journal) == (sid, appended.id, (appended.id,))

        # the platform (an Idempotency-Key) sends it again: stored once, nothing read
        again = db.turns.store_then_context("k", "and now?", query, platform_message_id="m1")
        assert (again[1], again[2]) == ((appended.id, False), None)
        turned_down = db.turns.store_then_context("k", "stale?", query, platform_message_id="m2",
                                                  keep=lambda row: False)
        assert turned_down[1:] == (None, None)
        assert [m.content for m in db.messages.get(sid)] == ["earlier", "an answer", "and now?"]


def test_a_turns_context_is_read_in_one_call_as_each_part_reads_alone(store):
    """db.turns.context: the conversation (as far as a message), the session's start, its media, the
    tool journal and the chat's facts choice, each as the feature's own read gives it; a part not asked
    for is None."""
    from state import ContextQuery, FactsChoice, FactsOwner

    with store as db:
        sid = db.sessions.create(new_session_id(), "telegram", session_key="k")
        first = db.messages.append(sid, "user", "look at this")
        db.media.attach(first, [{"sha256": "ab" * 32, "name": "cat.jpg", "mime": "image/jpeg", "size": 3,
                                 "kind": "image", "text": None, "note": None}])
        db.messages.append(sid, "assistant", "a cat")
        asked = db.messages.append(sid, "user", "and now?")
        db.messages.append(sid, "user", "stored after the turn's message")
        db.tool_journal.save(asked, sid, "[]", "call-1", now=5.0)
        db.facts.set_prefetch("k", False, now=6.0)
        db.prefs.set("k", "model", "fast", now=6.0)

        everything = db.turns.context(ContextQuery(sid, conversation=True, upto=asked, started=True, media=True,
                                                   journal=(asked,), facts=FactsOwner("k", "main", "telegram:u1"),
                                                   prefs=("k", ("model", "stream"))))
        assert list(everything.conversation) == db.messages.as_conversation(sid, upto=asked)
        assert [m["content"] for m in everything.conversation] == ["look at this", "a cat", "and now?"]
        assert everything.started_at == db.sessions.get(sid).started_at
        assert list(everything.media) == db.media.of_lineage(sid) and everything.media[0]["name"] == "cat.jpg"
        assert everything.journal == db.tool_journal.newest([asked]) and everything.journal["running"] == "call-1"
        assert everything.facts == FactsChoice(prefetch=False, any_facts=False)
        assert everything.prefs == (("model", "fast"), ("stream", None)) and everything.pref("model") == "fast"

        db.facts.add("main", "telegram:u1", "likes cats", ["cats"], session_id=sid, trust=0.5, now=7.0, hrr=None)
        assert db.turns.context(ContextQuery(sid, facts=FactsOwner("k", "main", "telegram:u1"))).facts.any_facts
        nothing = db.turns.context(ContextQuery(sid))
        assert (nothing.conversation, nothing.started_at, nothing.media, nothing.journal, nothing.facts,
                nothing.prefs) == (None, None, None, None, None, None)


def test_a_chat_turns_context_is_read_where_a_compression_moved_its_conversation(store):
    """``continued``: the lane of a platform chat reads its batch's context with the conversation where it
    goes on: the session itself as far as the batch's last message, or the child a compression moved it
    to (all of it: what the split copied and what came since), as ``continued_conversation`` reads it."""
    from state import ContextQuery

    with store as db:
        sid = db.sessions.create(new_session_id(), "telegram", session_key="k")
        db.routes.set("k", sid)
        d1 = db.messages.append(sid, "user", "d1")
        later = db.messages.append(sid, "user", "stored after the batch")
        here = db.turns.context(ContextQuery(sid, conversation=True, upto=d1, started=True, continued=True))
        assert here.session_id == sid and [m["content"] for m in here.conversation] == ["d1"]
        assert here.started_at == db.sessions.get(sid).started_at

        split = db.compression.split(sid, [{"role": "user", "content": "summary"}, {"role": "user", "content": "d1"},
                                           {"role": "user", "content": "stored after the batch"}],
                                     expected_message_ids=[d1, later])
        moved = db.turns.context(ContextQuery(sid, conversation=True, upto=d1, started=True, continued=True))
        assert (moved.session_id, list(moved.conversation)) == db.compression.continued_conversation(sid, upto=d1)
        assert moved.session_id == split.child_id and moved.started_at == db.sessions.get(split.child_id).started_at
        assert [m["content"] for m in moved.conversation] == ["summary", "d1", "stored after the batch"]
        unmoved = db.turns.context(ContextQuery(sid, conversation=True, upto=d1))  # not asked to follow it
        assert unmoved.session_id == sid and [m["content"] for m in unmoved.conversation] == ["d1"]


def test_a_claimed_sessions_waiting_messages_are_read_with_its_turns_context(store):
    """``unanswered``: the messages still waiting (as ``Recovery.unanswered`` gives them) and the turn's
    context as far as the last of them, the conversation and the tool journal theirs, in one read; what
    it read says so, so the turn asks for none of it again."""
    from state import ContextQuery, FactsOwner

    inbox = {"session_key": "k", "platform": "telegram", "chat_id": "1", "chat_type": "dm", "user_id": "1"}
    owner = FactsOwner("k", "main", "telegram:1")
    with store as db:
        sid = db.sessions.create(new_session_id(), "telegram", session_key="k")
        ids = [db.messages.append_inbound(sid, f"d{i}", platform_message_id=str(i),
                                          inbox={**inbox, "platform_message_id": str(i)}).id for i in (1, 2, 3)]
        db.messages.record_turn(sid, [{"role": "assistant", "content": "r1"}], answered=ids[:1])
        db.tool_journal.save(ids[2], sid, "[]", "call-1", now=5.0)

        read = db.turns.context(ContextQuery(sid, conversation=True, upto=ids[0], started=True, journal=(ids[0],),
                                             facts=owner, unanswered=True))
        assert list(read.unanswered) == db.recovery.unanswered(sid)
        assert [row["text"] for row in read.unanswered] == ["d2", "d3"]
        assert [m["content"] for m in read.conversation] == ["d1", "r1", "d2", "d3"]
        assert read.journal == db.tool_journal.newest(ids[1:]) and read.journal["running"] == "call-1"
        assert (read.asked.upto, read.asked.journal) == (ids[2], tuple(ids[1:]))
        assert read.started_at == db.sessions.get(sid).started_at
        the_turns = ContextQuery(sid, upto=ids[2], started=True, journal=tuple(ids[1:]), facts=owner)
        assert read.lacking(the_turns) == ContextQuery(sid)

        db.messages.record_turn(sid, [{"role": "assistant", "content": "r3"}], answered=ids[1:])
        none = db.turns.context(ContextQuery(sid, conversation=True, journal=(ids[0],), unanswered=True))
        assert none.unanswered == () and none.journal is None and none.asked.upto is None
        assert [m["content"] for m in none.conversation] == ["d1", "r1", "d2", "d3", "r3"]
        assert db.turns.context(ContextQuery(sid, conversation=True)).unanswered is None  # not asked for


def test_a_turn_reads_only_what_its_callers_read_of_its_context_lacks():
    """``TurnContext.lacking``/``merged``: what the lane read with the history is not read again; what the
    turn needs beyond it (here: a /model choice the lane's copy no longer had fresh) is, and joins it."""
    from state import ContextQuery, FactsOwner, TurnContext

    owner = FactsOwner("k", "main", "telegram:u1")
    read = TurnContext(conversation=({"role": "user", "content": "d1"},), started_at=1.0, media=(), journal=None,
                       session_id="s", asked=ContextQuery("s", conversation=True, upto=7, started=True, media=True,
                                                          journal=(7,), facts=owner, continued=True))
    same = ContextQuery("s", upto=7, started=True, media=True, journal=(7,), facts=owner)
    assert read.lacking(same) == ContextQuery("s")
    more = read.lacking(ContextQuery("s", upto=7, media=True, journal=(7,), facts=owner, prefs=("k", ("model",))))
    assert more == ContextQuery("s", prefs=("k", ("model",)))
    joined = read.merged(TurnContext(prefs=(("model", "fast"),), session_id="s", asked=more))
    assert (joined.pref("model"), joined.started_at, joined.conversation) == ("fast", 1.0, read.conversation)
    assert read.lacking(ContextQuery("elsewhere", media=True)) == ContextQuery("elsewhere", media=True)
