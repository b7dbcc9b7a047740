"""The A2A endpoint driven by the protocol's own SDK (``a2a-sdk``'s client), against the real gateway
and the fake model: the card, SendMessage whole and streamed, contexts as sessions, GetTask and
CancelTask, the callers' tokens, push notifications with retries, and the rate limit."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from aiohttp import web

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel, Hang, Held, Reply, refusal
from tests.harness import eventually, gateway_config, running_gateway

PLANNER = "planner-token-0123456789abcdef"
OTHER = "other-token-0123456789abcdef"


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def a2a_config(**extra) -> dict:
    callers = {"planner": {"token": PLANNER}, "other": {"token": OTHER}}
    return {"a2a": {"enabled": True, "name": "Test agent", "wait_seconds": 10, "callers": callers, **extra}}


def base_url(gw) -> str:
    return f"http://127.0.0.1:{gw.api.bound_port}"


@asynccontextmanager
async def connected(gw, token: str | None, *, streaming: bool = False, polling: bool = False):
    """The SDK's client for the gateway's card, sending ``token`` (None: no Authorization header)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        yield await create_client(base_url(gw), ClientConfig(streaming=streaming, polling=polling, httpx_client=http))


def user_message(text: str, context_id: str | None = None, message_id: str | None = None) -> pb.Message:
    return pb.Message(message_id=message_id or uuid.uuid4().hex, role=pb.ROLE_USER, parts=[pb.Part(text=text)],
                      context_id=context_id or "")


async def events(client, message: pb.Message, **config) -> list[pb.StreamResponse]:
    request = pb.SendMessageRequest(message=message, configuration=pb.SendMessageConfiguration(**config))
    return [event async for event in client.send_message(request)]


def answer_of(task: pb.Task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


async def test_the_card_names_the_agent_its_tools_as_skills_and_the_bearer_scheme(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, base_url(gw)).get_agent_card()
    assert card.name == "Test agent"
    assert [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces] == \
        [("JSONRPC", f"{base_url(gw)}/a2a", "1.0")]
    skills = {skill.id for skill in card.skills}
    assert "chat" in skills and "session_search" in skills  # the configured tools
    assert card.capabilities.streaming and card.capabilities.push_notifications
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]


async def test_a_message_is_answered_in_its_task_and_its_context_is_one_session(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER) as client:
            [first] = await events(client, user_message("plan the week"))
            task = first.task
            assert task.status.state == pb.TASK_STATE_COMPLETED
            assert answer_of(task) == "echo: plan the week | turns: 1 | first: plan the week"
            [second] = await events(client, user_message("and the weekend", task.context_id), history_length=5)
            assert second.task.context_id == task.context_id and second.task.id != task.id
            assert answer_of(second.task) == "echo: and the weekend | turns: 2 | first: plan the week"
            assert [m.parts[0].text for m in second.task.history] == ["plan the week", answer_of(task)]
            fetched = await client.get_task(pb.GetTaskRequest(id=task.id))
            assert fetched.status.state == pb.TASK_STATE_COMPLETED and answer_of(fetched) == answer_of(task)
        key = f"agent:main:a2a:planner:{task.context_id}"
        session_id = await gw.db.routes.get(key)
        stored = [(m.role, m.content) for m in await gw.db.messages.get(session_id)]
    assert stored == [("user", "plan the week"), ("assistant", answer_of(task)),
                      ("user", "and the weekend"), ("assistant", answer_of(second.task))]


async def test_a_streamed_answer_comes_as_artifact_chunks_then_the_final_status(tmp_path, model):
    text = "Streaming shows the answer as the model writes it, piece after piece."
    model.script(Reply(text))
    model.stream_chunk_chars, model.stream_interval = 10, 0.02
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, streaming=True) as client:
            got = await events(client, user_message("stream it"))
    assert got[0].task.status.state == pb.TASK_STATE_WORKING
    chunks = [e.artifact_update for e in got if e.HasField("artifact_update")]
    assert len(chunks) > 2, "the answer came in one piece, not as the model wrote it"
    assert "".join(c.artifact.parts[0].text for c in chunks) == text
    assert chunks[-1].last_chunk and not chunks[0].append and all(c.append for c in chunks[1:])
    assert got[-1].status_update.status.state == pb.TASK_STATE_COMPLETED


async def test_a_caller_that_lost_its_stream_subscribes_again_and_gets_the_answer_to_its_end(tmp_path, model):
    release = asyncio.Event()
    model.script(Held(release))
    model.stream_chunk_chars, model.stream_interval = 6, 0.02
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, streaming=True) as client:
            request = pb.SendMessageRequest(message=user_message("a long answer, please"))
            stream = client.send_message(request)
            first = await stream.__anext__()
            await stream.aclose()  # the connection is lost
            await model.wait_for_requests(1)
            again = client.subscribe(pb.SubscribeToTaskRequest(id=first.task.id))
            attached = await again.__anext__()
            release.set()
            rest = [event async for event in again]
            fetched = await client.get_task(pb.GetTaskRequest(id=first.task.id))
    assert attached.task.id == first.task.id and attached.task.status.state == pb.TASK_STATE_WORKING
    chunks = [e.artifact_update for e in rest if e.HasField("artifact_update")]
    assert len(chunks) > 2, "the answer came in one piece, not as the model wrote it"
    assert "".join(c.artifact.parts[0].text for c in chunks) == answer_of(fetched) != ""
    assert chunks[-1].last_chunk and not chunks[0].append
    assert rest[-1].status_update.status.state == pb.TASK_STATE_COMPLETED


async def test_subscribing_to_an_ended_task_is_refused_as_the_protocol_says_and_to_anothers_is_not_found(
        tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, streaming=True) as client:
            done = (await events(client, user_message("quick")))[-1].status_update
            assert done.status.state == pb.TASK_STATE_COMPLETED
            with pytest.raises(UnsupportedOperationError, match="already ended"):
                [e async for e in client.subscribe(pb.SubscribeToTaskRequest(id=done.task_id))]
        async with connected(gw, OTHER, streaming=True) as other:
            with pytest.raises(TaskNotFoundError):
                [e async for e in other.subscribe(pb.SubscribeToTaskRequest(id=done.task_id))]
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {PLANNER}"}) as http:  # the 0.3 name
            legacy = await http.post(f"{base_url(gw)}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe",
                                                                 "params": {"id": done.task_id}})
    assert legacy.json()["error"]["code"] == -32004


async def test_a_retried_message_is_one_task_answered_once(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER) as client:
            message = user_message("only once", message_id="m-1")
            [first] = await events(client, message)
            [again] = await events(client, message)
    assert again.task.id == first.task.id and answer_of(again.task) == answer_of(first.task)
    assert len(model.requests) == 1


async def test_callers_need_their_own_token_and_never_see_each_others_tasks(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        for token in (None, "wrong-token", "x" * 40):
            async with connected(gw, token) as client:
                with pytest.raises(A2AClientError, match="401"):
                    await events(client, user_message("let me in"))
        async with connected(gw, PLANNER) as client:
            [done] = await events(client, user_message("mine"))
        async with connected(gw, OTHER) as other:
            with pytest.raises(TaskNotFoundError):
                await other.get_task(pb.GetTaskRequest(id=done.task.id))
            with pytest.raises(TaskNotFoundError):
                await other.cancel_task(pb.CancelTaskRequest(id=done.task.id))
            # the same context id is another session for another caller
            [theirs] = await events(other, user_message("hello", done.task.context_id))
        assert answer_of(theirs.task).endswith("turns: 1 | first: hello")
    assert not model.requests[0].messages[-1]["content"].startswith("let me in")


async def test_without_callers_only_loopback_is_served_as_local(tmp_path, model):
    async with running_gateway(tmp_path, model, a2a={"enabled": True}) as gw:
        async with connected(gw, None) as client:
            [done] = await events(client, user_message("hi"))
        assert done.task.status.state == pb.TASK_STATE_COMPLETED
        assert await gw.db.routes.get(f"agent:main:a2a:local:{done.task.context_id}")


async def test_cancel_stops_the_running_turn_and_the_task_ends_canceled(tmp_path, model):
    release = asyncio.Event()
    model.script(Held(release))
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, polling=True) as client:
            [started] = await events(client, user_message("a long job"))
            assert started.task.status.state == pb.TASK_STATE_WORKING
            await model.wait_for_requests(1)
            canceled = await client.cancel_task(pb.CancelTaskRequest(id=started.task.id))
            assert canceled.status.state == pb.TASK_STATE_CANCELED
            await eventually(lambda: not gw.router.working_on(f"agent:main:a2a:planner:{started.task.context_id}"),
                             what="the turn stopped")
            release.set()
            fetched = await client.get_task(pb.GetTaskRequest(id=started.task.id))
            assert fetched.status.state == pb.TASK_STATE_CANCELED and not fetched.artifacts
            [done] = await events(client, user_message("quick one"))
            await eventually(lambda: client.get_task(pb.GetTaskRequest(id=done.task.id)), what="the next task")
            answered = await client.get_task(pb.GetTaskRequest(id=done.task.id))
            await eventually(lambda: _ended(client, done.task.id), what="the next task answered")
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(pb.CancelTaskRequest(id=done.task.id))
    assert answered.id == done.task.id


async def _ended(client, task_id: str) -> bool:
    task = await client.get_task(pb.GetTaskRequest(id=task_id))
    return task.status.state == pb.TASK_STATE_COMPLETED


async def _over(client, task_id: str) -> pb.Task | None:
    task = await client.get_task(pb.GetTaskRequest(id=task_id))
    return task if task.status.state != pb.TASK_STATE_WORKING else None


async def test_a_stop_sent_in_the_context_cancels_the_running_task_and_answers_its_own(tmp_path, model):
    release = asyncio.Event()
    model.script(Held(release))
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, polling=True) as client:
            [started] = await events(client, user_message("a long job"))
            await model.wait_for_requests(1)
            [stop] = await events(client, user_message("/stop", started.task.context_id))
            stopped = await eventually(lambda: _over(client, started.task.id), what="the stopped task ended")
            answered = await eventually(lambda: _over(client, stop.task.id), what="the /stop task answered")
            release.set()
    assert stopped.status.state == pb.TASK_STATE_CANCELED and not stopped.artifacts
    assert answered.status.state == pb.TASK_STATE_COMPLETED and answer_of(answered)


async def test_a_streamed_task_whose_model_call_fails_ends_failed_with_no_answer(tmp_path, model):
    model.script(refusal(401))
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, streaming=True) as client:
            got = await events(client, user_message("this will fail"))
    final = got[-1].status_update.status
    assert final.state == pb.TASK_STATE_FAILED and "refused the API key" in final.message.parts[0].text
    assert not [e for e in got if e.HasField("artifact_update")]


async def test_a_task_whose_model_call_fails_after_a_restart_ends_failed_saying_why(tmp_path, model):
    model.script(Hang())  # the first call never answers: the stop comes while it runs
    cfg = gateway_config(tmp_path, model.base_url, **a2a_config())
    first = Gateway(cfg, adapters={})
    await first.start()
    try:
        async with connected(first, PLANNER, polling=True) as client:
            [started] = await events(client, user_message("answer me later"))
        await model.wait_for_requests(1)
    finally:
        await first.stop(grace_seconds=0.2)  # the turn is cut off: its message stays unanswered in the store
    model.script(refusal(401))  # the restarted instance's call is refused
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER, polling=True) as client:
            done = await eventually(lambda: _over(client, started.task.id), timeout=20, what="the task ended")
    assert done.status.state == pb.TASK_STATE_FAILED, answer_of(done)
    assert "refused the API key" in done.status.message.parts[0].text and not done.artifacts


class PushReceiver:
    """The caller's push endpoint: refuses the first ``refuse`` tries with 503, then records each push."""

    def __init__(self, refuse: int = 0):
        self.refuse = refuse
        self.tries = 0
        self.received: list[tuple[dict, str | None]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.tries += 1
        if self.tries <= self.refuse:
            return web.Response(status=503)
        self.received.append((await request.json(), request.headers.get("X-A2A-Notification-Token")))
        return web.Response(status=204)


async def test_a_push_notification_reaches_the_callback_after_retries(tmp_path, model):
    receiver = PushReceiver(refuse=2)
    app = web.Application()
    app.router.add_post("/hooks/a2a/{rest:.*}", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    push_url = f"http://127.0.0.1:{port}/hooks/a2a/"
    callers = {"planner": {"token": PLANNER, "push_url": push_url}, "other": {"token": OTHER}}
    try:
        async with running_gateway(tmp_path, model, a2a={"enabled": True, "callers": callers}) as gw:
            async with connected(gw, PLANNER) as client:
                push = pb.TaskPushNotificationConfig(url=f"{push_url}tasks", token="caller-secret")
                [done] = await events(client, user_message("tell me later"), task_push_notification_config=push)
                await eventually(lambda: receiver.received, timeout=20, what="the push notification")
                async with connected(gw, OTHER) as other:  # a URL outside the one configured for the caller is refused
                    with pytest.raises(InvalidParamsError, match="push notifications go only under"):
                        await events(other, user_message("push elsewhere"),
                                     task_push_notification_config=pb.TaskPushNotificationConfig(url=push_url))
    finally:
        await runner.cleanup()
    body, token = receiver.received[0]
    assert token == "caller-secret" and receiver.tries == 3
    assert body["task"]["id"] == done.task.id and body["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert body["task"]["artifacts"][0]["parts"][0]["text"] == answer_of(done.task)


async def test_the_rate_limit_holds_an_a2a_callers_task_as_any_users(tmp_path, model):
    async with running_gateway(tmp_path, model, limits={"messages_per_minute": 1}, **a2a_config()) as gw:
        async with connected(gw, PLANNER, polling=True) as client:
            [first] = await events(client, user_message("one"))
            await eventually(lambda: _ended(client, first.task.id), what="the first answer")
            [second] = await events(client, user_message("two"))
            held = await eventually(lambda: _noted(client, second.task.id), what="the held task's status")
        assert held.status.state == pb.TASK_STATE_WORKING
        assert "try again" in held.status.message.parts[0].text.lower() or "minute" in held.status.message.parts[0].text
        async with connected(gw, OTHER) as other:  # another caller is another user: not held
            [theirs] = await events(other, user_message("three"))
            await eventually(lambda: _ended(other, theirs.task.id), what="the other caller's answer")
    assert len(model.requests) == 2


async def _noted(client, task_id: str) -> pb.Task | None:
    task = await client.get_task(pb.GetTaskRequest(id=task_id))
    return task if task.status.HasField("message") else None


async def test_a_bad_request_gets_a_clear_error_and_harms_nothing(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        url = f"{base_url(gw)}/a2a"
        auth = {"Authorization": f"Bearer {PLANNER}"}
        async with httpx.AsyncClient(headers=auth) as http:
            cases = [
                (b"{not json", -32700),
                (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope"}', -32601),
                (b'{"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {}}', -32602),
                (b'{"jsonrpc": "2.0", "id": 3, "method": "message/send", "params": {"message": {"messageId": "x", '
                 b'"parts": [{"url": "file:///etc/passwd"}]}}}', -32005),
                (b'{"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"id": "nope"}}', -32001),
            ]
            for body, code in cases:
                response = await http.post(url, content=body, headers={"Content-Type": "application/json"})
                assert response.json()["error"]["code"] == code, body
            async with connected(gw, PLANNER) as client:
                [done] = await events(client, user_message("still fine"))
    assert done.task.status.state == pb.TASK_STATE_COMPLETED


async def test_a_command_is_answered_in_its_task_without_the_model(tmp_path, model):
    async with running_gateway(tmp_path, model, **a2a_config()) as gw:
        async with connected(gw, PLANNER) as client:
            [done] = await events(client, user_message("/help"))
    assert done.task.status.state == pb.TASK_STATE_COMPLETED
    assert "/stop" in answer_of(done.task)  # the list of commands
    assert model.requests == []
