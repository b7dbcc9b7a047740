"""The gateway end to end through its local API, the real openai SDK on both sides of it."""

import asyncio
import time

import aiohttp
import openai
import pytest

import state
from tests.fakes.model_server import Fail, FakeModel, Hang, Reply
from tests.harness import ApiClient, Clock, eventually, running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def test_a_conversation_is_remembered_across_turns(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        assert await api.say("alice", "my name is Alice") == "echo: my name is Alice | turns: 1 | first: my name is Alice"
        assert await api.say("alice", "what is my name?") == "echo: what is my name? | turns: 2 | first: my name is Alice"
        # another key is another conversation
        assert await api.say("bob", "hello") == "echo: hello | turns: 1 | first: hello"
        await api.close()
        sid = await gw.db.routes.get("agent:main:api:dm:alice")
        stored = await gw.db.messages.get(sid)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "my name is Alice"),
        ("assistant", "echo: my name is Alice | turns: 1 | first: my name is Alice"),
        ("user", "what is my name?"),
        ("assistant", "echo: what is my name? | turns: 2 | first: my name is Alice"),
    ]
    # the system prompt names the platform and the date
    system = model.requests[0].messages[0]
    assert system["role"] == "system" and "api" in system["content"] and "current date" in system["content"]


async def test_token_usage_is_recorded(tmp_path, model):
    model.script(Reply("hi", prompt_tokens=1234))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("k", "hello")
        await api.close()
        session = await gw.db.sessions.get(await gw.db.routes.get("agent:main:api:dm:k"))
    assert session.input_tokens == 1234 and session.output_tokens > 0


async def test_title_new_and_resume(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("u", "let's plan the trip")
        assert await api.say("u", "/title") == "This session has no title. Set one with /title <name>."
        assert await api.say("u", "/title Trip planning") == "Session title set: Trip planning"
        first = await gw.db.routes.get("agent:main:api:dm:u")
        answer = await api.say("u", "/new")
        assert answer.startswith("Started a new session.") and first in answer
        assert await api.say("u", "fresh start") == "echo: fresh start | turns: 1 | first: fresh start"
        second = await gw.db.routes.get("agent:main:api:dm:u")
        assert second != first
        # a duplicate title is refused, naming the holder
        assert await api.say("u", "/title Trip planning") == (
            f'The title "Trip planning" is already used by your session {first}. Choose another.')
        assert (await api.say("u", "/resume Trip planning")).startswith('Resumed "Trip planning"')
        assert await api.say("u", "and the hotel?") == "echo: and the hotel? | turns: 2 | first: let's plan the trip"
        listing = await api.say("u", "/sessions")
        assert "Trip planning" in listing and second in listing
        assert (await api.say("u", "/frobnicate")).startswith("Unknown command /frobnicate.")
        await api.close()
    # commands never reached the model: 4 real turns only
    assert len(model.requests) == 3


async def test_a_user_cannot_resume_someone_elses_session(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("alice", "secret plans")
        await api.say("alice", "/title Alice plans")
        assert await api.say("mallory", "/resume Alice plans") == (
            'No session of yours matches "Alice plans". /resume alone lists yours.')
        await api.close()


async def test_status_reports_the_session(tmp_path, model):
    model.script(Reply("ok", prompt_tokens=8192))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("s", "hello")
        status = await api.say("s", "/status")
        await api.close()
    assert "Messages: 2" in status and "Context used: 25% of 32,768 tokens" in status


async def test_429_then_success_is_answered_once(tmp_path, model):
    model.script(Fail(429, retry_after=0.2), Reply("finally"))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        assert await api.say("k", "hi") == "finally"
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    assert len(model.requests) == 2
    assert model.requests[1].at - model.requests[0].at >= 0.2  # Retry-After honoured
    assert [m.role for m in stored] == ["user", "assistant"]


async def test_total_model_failure_is_a_503_and_the_message_is_kept_then_a_normal_turn(tmp_path, model):
    model.script(*[Fail(503)] * 4)  # max_retries=3: four attempts, all fail
    async with running_gateway(tmp_path, model, model={"retry_total_seconds": 30}) as gw:
        api = ApiClient(gw)
        with pytest.raises(openai.InternalServerError) as failed:
            await api.say("k", "first question")
        assert failed.value.status_code == 503
        assert failed.value.code == "model_unavailable" and "Your message is saved" in failed.value.message
        assert failed.value.response.headers["Retry-After"] == "2"
        assert await api.say("k", "second question") == "echo: second question | turns: 2 | first: first question"
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    assert [(m.role, m.content) for m in stored][:2] == [("user", "first question"), ("user", "second question")]
    assert len(stored) == 3


@pytest.mark.slow  # 50 sessions of 10 turns (about 10 s): make test runs it, make test-fast leaves it out
async def test_fifty_sessions_at_once_answer_in_order(tmp_path):
    async with FakeModel(delay=0.05) as model:
        async with running_gateway(tmp_path, model, model={"max_concurrent_calls": 16}) as gw:
            api = ApiClient(gw)

            async def conversation(i: int) -> list[str]:
                return [await api.say(f"user{i}", f"u{i} message {n}") for n in range(3)]

            results = await asyncio.gather(*(conversation(i) for i in range(50)))
            await api.close()
        assert model.max_in_flight <= 16
    for i, replies in enumerate(results):
        assert replies == [f"echo: u{i} message {n} | turns: {n + 1} | first: u{i} message 0" for n in range(3)]


async def test_messages_sent_during_a_turn_are_answered_after_it(tmp_path):
    async with FakeModel(delay=0.3) as model:
        async with running_gateway(tmp_path, model) as gw:
            api = ApiClient(gw)
            first = asyncio.create_task(api.say("k", "one"))
            await model.wait_for_requests(1)
            second = asyncio.create_task(api.say("k", "two"))
            third = asyncio.create_task(api.say("k", "three"))
            replies = await asyncio.gather(first, second, third)
            await api.close()
            stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    # two and three waited for the first turn; each request got a turn and an answer of its own, in order
    assert replies == [f"echo: {word} | turns: {n} | first: one" for n, word in enumerate(["one", "two", "three"], 1)]
    assert [(m.role, m.content) for m in stored] == [
        pair for n, word in enumerate(["one", "two", "three"], 1)
        for pair in (("user", word), ("assistant", f"echo: {word} | turns: {n} | first: one"))]
    # no prompt ended with an answer: each ended with its own request
    assert [r.messages[-1] for r in model.requests] == [{"role": "user", "content": w} for w in ["one", "two", "three"]]


async def test_stop_cancels_the_running_turn_and_keeps_the_message(tmp_path, model):
    model.script(Hang(30))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        slow = asyncio.create_task(api.say("k", "write me a novel"))
        await model.wait_for_requests(1)
        assert await api.say("k", "/stop") == "Stopping the current reply."
        assert (await slow).startswith("Stopped.")
        assert await api.say("k", "shorter please") == "echo: shorter please | turns: 2 | first: write me a novel"
        await api.close()


async def test_stop_while_the_turn_is_being_set_up_stops_it_before_the_model_is_asked(tmp_path, model):
    """Ctrl-C in the terminal chat that lands after a request left the queue but before its turn started
    (its message still being stored: here another process holds the database's write lock) stops that turn
    as soon as it starts, instead of finding nothing to stop and letting the answer run on."""
    import sqlite3

    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        key = "agent:main:api:dm:k"
        assert await api.say("k", "hello") == "echo: hello | turns: 1 | first: hello"  # the session exists
        blocker = sqlite3.connect(gw.config.db_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # the store's writer waits for this lock
            slow = asyncio.create_task(api.say("k", "write me a novel"))
            await eventually(lambda: gw.router.working_on(key) and gw.router.queued_messages() == 0, 10,
                             "the request taken from its lane's queue")
            assert gw.router.stop_turn(key)  # what the terminal chat's Ctrl-C calls
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert (await slow).startswith("Stopped.")
        assert len(model.requests) == 1  # the model was never asked about the novel
        assert await api.say("k", "shorter please") == "echo: shorter please | turns: 3 | first: hello"
        await api.close()


async def test_an_idempotency_key_stores_and_answers_once_and_a_retry_gets_the_stored_reply(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        url = f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"
        body = {"model": "x", "messages": [{"role": "user", "content": "once"}]}
        headers = {"X-Session-Key": "k", "Idempotency-Key": "evt-1"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body, headers=headers) as r1:
                assert r1.status == 200
                first = await r1.json()
            async with http.post(url, json=body, headers=headers) as r2:
                assert r2.status == 200
                again = await r2.json()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    assert again["choices"][0]["message"]["content"] == "echo: once | turns: 1 | first: once"
    assert (again["id"], again["session_id"]) == (first["id"], first["session_id"])
    assert [m.content for m in stored if m.role == "user"] == ["once"]
    assert len(model.requests) == 1


async def test_bad_requests_get_clear_errors(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        url = f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=b"{not json") as r:
                assert r.status == 400 and "not valid JSON" in (await r.json())["error"]["message"]
            async with http.post(url, json={"messages": [{"role": "assistant", "content": "x"}]}) as r:
                assert r.status == 400 and "no user message" in (await r.json())["error"]["message"]
            async with http.post(url, json={"messages": []}, headers={"X-Session-Key": "k"}) as r:
                assert r.status == 400
            async with http.post(url, json={"messages": [{"role": "user", "content": "x"}], "n": 2}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "n"
            async with http.post(url, json={"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "temperature"
    assert model.requests == []


async def test_api_token_is_required_when_set(tmp_path, model):
    async with running_gateway(tmp_path, model, api={"token": "s3cret-token"}) as gw:
        base = f"http://127.0.0.1:{gw.api.bound_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as r:
                assert r.status == 401
            async with http.get(base + "/healthz", headers={"Authorization": "Bearer s3cret-token"}) as r:
                assert r.status == 200


async def test_healthz_and_metrics(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("k", "hello")
        await api.close()
        base = f"http://127.0.0.1:{gw.api.bound_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as r:
                health = await r.json()
            async with http.get(base + "/metrics") as r:
                metrics = await r.text()
    assert health["status"] == "ok"
    assert health["platforms"]["telegram"]["state"] == "disabled"
    assert health["cron"] == {"jobs_armed": 0, "next_run_at": None}
    assert 'switchboard_messages_in_total{platform="api"} 1.0' in metrics
    assert "switchboard_turn_seconds_bucket" in metrics


# -- reset policies --------------------------------------------------------

async def _session_for(gw, key="agent:main:api:dm:k"):
    return await gw.db.routes.get(key)


async def test_idle_reset_ends_the_old_session_and_says_how_to_go_back(tmp_path, model):
    clock = Clock()
    async with running_gateway(tmp_path, model, clock=clock,
                               sessions={"reset": {"mode": "idle", "idle_minutes": 60}}) as gw:
        api = ApiClient(gw)
        await api.say("k", "before the break")
        old = await _session_for(gw)
        clock.advance(59 * 60)
        await api.say("k", "still here")
        assert await _session_for(gw) == old
        clock.advance(61 * 60)
        raw = await api.client.chat.completions.with_raw_response.create(
            model="switchboard", messages=[{"role": "user", "content": "back again"}],
            extra_headers={"X-Session-Key": "k"})
        new = await _session_for(gw)
        await api.close()
        ended = await gw.db.sessions.get(old)
        first_prompt = model.requests[-1].messages
    assert new != old
    assert ended.end_reason == "idle"
    # the notice comes beside the answer, in a header, never in it
    assert raw.headers["X-Switchboard-Notice"] == ("(Started a new session: the previous one was idle for more than "
                                                   f"1 h. Send /resume {old} to go back.)")
    assert raw.headers["X-Switchboard-Session"] == new
    assert raw.parse().choices[0].message.content == "echo: back again | turns: 1 | first: back again"
    assert any(m["role"] == "system" and old in m["content"] for m in first_prompt)


async def test_daily_reset_at_the_configured_hour(tmp_path, model):
    import datetime as dt

    clock = Clock()
    now = dt.datetime.now(dt.timezone.utc)
    next_hour = (now.hour + 1) % 24
    async with running_gateway(tmp_path, model, clock=clock, timezone="UTC",
                               sessions={"reset": {"mode": "daily", "at_hour": next_hour}}) as gw:
        api = ApiClient(gw)
        await api.say("k", "morning")
        old = await _session_for(gw)
        clock.advance(3600 - now.minute * 60 - now.second + 60)  # just past next_hour:00
        await api.say("k", "after the hour")
        assert await _session_for(gw) != old
        assert (await gw.db.sessions.get(old)).end_reason == "daily"
        await api.close()


async def test_none_never_resets_and_overrides_by_type_apply(tmp_path, model):
    clock = Clock()
    async with running_gateway(tmp_path, model, clock=clock, sessions={"reset": {
            "mode": "idle", "idle_minutes": 10, "by_type": {"dm": {"mode": "none"}}}}) as gw:
        api = ApiClient(gw)  # API sessions are DMs
        await api.say("k", "one")
        old = await _session_for(gw)
        clock.advance(30 * 24 * 3600)
        await api.say("k", "a month later")
        assert await _session_for(gw) == old
        await api.close()


async def test_both_mode_and_a_restart_evaluate_the_policy_on_the_first_message(tmp_path, model):
    clock = Clock()
    settings = {"sessions": {"reset": {"mode": "both", "idle_minutes": 120, "at_hour": 4}}}
    async with running_gateway(tmp_path, model, clock=clock, **settings) as gw:
        api = ApiClient(gw)
        await api.say("k", "before restart")
        await api.close()
        old = await _session_for(gw)
    clock.advance(3 * 3600)
    async with running_gateway(tmp_path, model, clock=clock, **settings) as gw:
        api = ApiClient(gw)
        answer = await api.say("k", "after restart")
        await api.close()
        assert await _session_for(gw) != old
        assert (await gw.db.sessions.get(old)).end_reason in ("idle", "daily")
    assert answer == "echo: after restart | turns: 1 | first: after restart"


async def test_a_restart_continues_the_same_conversation(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("k", "remember me")
        await api.close()
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        assert await api.say("k", "still there?") == "echo: still there? | turns: 2 | first: remember me"
        await api.close()


async def test_the_state_directory_is_private(tmp_path, model):
    home = tmp_path / "home"
    async with running_gateway(home, model) as gw:
        api = ApiClient(gw)
        await api.say("k", "hi")
        await api.close()
    assert (home.stat().st_mode & 0o777) == 0o700
    assert (home / "state.db").stat().st_mode & 0o077 == 0
    with state.SessionDB(home / "state.db") as db:
        assert db.transfer.stats()["sessions"] == 1



async def test_a_turn_cut_off_by_shutdown_is_a_503_with_retry_after_and_keeps_the_message(tmp_path, model):
    from gateway.runtime.daemon import Gateway
    from tests.harness import gateway_config

    model.script(Hang(30))
    gw = Gateway(gateway_config(tmp_path, model.base_url))
    await gw.start()
    api = ApiClient(gw)
    pending = asyncio.create_task(api.say("k", "a very long question"))
    await model.wait_for_requests(1)
    stopping = asyncio.create_task(gw.stop(grace_seconds=0.3))
    with pytest.raises(openai.APIStatusError) as cut:
        await pending
    await stopping
    await api.close()
    assert cut.value.status_code == 503
    assert cut.value.response.headers["Retry-After"] == "10"
    assert "stopped before answering; your message is saved" in cut.value.message
    with state.SessionDB(tmp_path / "state.db") as store:
        stored = store.messages.get(store.routes.get("agent:main:api:dm:k"))
    assert [(m.role, m.content) for m in stored] == [("user", "a very long question")]


async def test_a_message_queued_behind_a_turn_cut_off_by_shutdown_gets_its_503_within_the_grace(tmp_path, model):
    from gateway.runtime.daemon import Gateway
    from tests.harness import gateway_config

    model.script(Hang(30))
    gw = Gateway(gateway_config(tmp_path, model.base_url))
    await gw.start()
    api = ApiClient(gw)
    first = asyncio.create_task(api.say("k", "a very long question"))
    await model.wait_for_requests(1)
    second = asyncio.create_task(api.say("k", "and another"))  # waits in the lane behind the first
    await eventually(lambda: gw.router.queued_messages() == 1)
    started = time.monotonic()
    await gw.stop(grace_seconds=0.3)
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    await api.close()
    assert [getattr(o, "status_code", o) for o in outcomes] == [503, 503]
    assert time.monotonic() - started < 10  # not aiohttp's 60 s shutdown timeout


async def test_idle_lanes_are_forgotten_and_conversations_go_on(tmp_path, model, monkeypatch):
    import gateway.router.lanes

    monkeypatch.setattr(gateway.router.lanes, "MAX_IDLE_LANES", 3)  # a small bound, to see it work
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        for i in range(6):
            await api.say(f"user{i}", "hello")
        assert len(gw.router._lanes) <= 4
        assert await api.say("user0", "still me?") == "echo: still me? | turns: 2 | first: hello"
        await api.close()
