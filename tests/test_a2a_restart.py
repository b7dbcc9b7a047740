"""A2A tasks outlive the process that took them: kill -9 of the real daemon (``switchboard run``) mid-task,
then a restart on the same home, or another instance on the same PostgreSQL store, answers the task;
``GetTask`` and ``CancelTask`` work from any instance.  The caller is ``a2a-sdk``'s own client."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from contextlib import asynccontextmanager

import httpx
import psycopg
import yaml
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb

from tests.clusterdaemons import FAST_FAILOVER, health, instance_dir, instance_settings
from tests.crashkit import Daemon
from tests.fakes.model_server import FakeModel, Hang, Held, refusal
from tests.harness import eventually
from tests.pgserver import free_port

TOKEN = "planner-token-0123456789abcdef"
A2A = {"enabled": True, "callers": {"planner": {"token": TOKEN}}}


@asynccontextmanager
async def connected(port: int, *, streaming: bool = False):
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        yield await create_client(f"http://127.0.0.1:{port}", ClientConfig(streaming=streaming, polling=True,
                                                                            httpx_client=http))


async def start_task(client, text: str) -> pb.Task:
    message = pb.Message(message_id=uuid.uuid4().hex, role=pb.ROLE_USER, parts=[pb.Part(text=text)])
    [event] = [e async for e in client.send_message(pb.SendMessageRequest(message=message))]
    return event.task


async def state_of(client, task_id: str) -> pb.Task:
    return await client.get_task(pb.GetTaskRequest(id=task_id))


async def ended(client, task_id: str) -> pb.Task | None:
    task = await state_of(client, task_id)
    return task if task.status.state != pb.TASK_STATE_WORKING else None


def answer_of(task: pb.Task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


async def test_a_task_killed_mid_answer_is_answered_after_the_restart(tmp_path):
    async with FakeModel() as model:
        model.script(Hang())  # the first call never answers: the kill comes while it runs
        port = free_port()
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000",
                      "context_length": 32768},
            "api": {"port": port}, "a2a": A2A, "logging": {"level": "INFO", "format": "text"}})
        await daemon.start()
        try:
            async with connected(port) as client:
                task = await start_task(client, "survive the crash")
                assert task.status.state == pb.TASK_STATE_WORKING
            await model.wait_for_requests(1)
            await daemon.kill()
            await daemon.start()
            async with connected(port) as client:
                done = await eventually(lambda: ended(client, task.id), timeout=30, what="the task answered")
        finally:
            await daemon.stop()
    assert done.status.state == pb.TASK_STATE_COMPLETED, daemon.log_problems()
    assert answer_of(done) == "echo: survive the crash | turns: 1 | first: survive the crash"
    with sqlite3.connect(daemon.db_path) as conn:
        stored = conn.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    assert stored == [("user", "survive the crash"), ("assistant", answer_of(done))]


async def test_another_instance_answers_a_task_whose_instance_was_killed_and_cancels_across(tmp_path, pg_url):
    async with FakeModel() as model:
        model.script(Hang())
        names = ("a", "b")
        daemons = [Daemon(instance_dir(tmp_path, name), instance_settings(pg_url, name, model.base_url,
                                                                          cluster=FAST_FAILOVER, a2a=A2A))
                   for name in names]
        ports = [api_port(d) for d in daemons]
        await asyncio.gather(*(d.start() for d in daemons))
        try:
            async with connected(ports[0]) as on_a, connected(ports[1]) as on_b:
                task = await start_task(on_a, "carry on elsewhere")
                await model.wait_for_requests(1)
                holder = await _holder(pg_url, task.context_id)
                killed = names.index(holder)
                await daemons[killed].kill()
                survivor = on_b if killed == 0 else on_a
                done = await eventually(lambda: ended(survivor, task.id), timeout=40, what="the task answered")
                assert done.status.state == pb.TASK_STATE_COMPLETED
                assert answer_of(done) == "echo: carry on elsewhere | turns: 1 | first: carry on elsewhere"

                await daemons[killed].start()
                model.script(Hang())
                second = await start_task(on_a, "stop me from the other side")
                await model.wait_for_requests(2)
                runs = await _holder(pg_url, second.context_id)
                other = on_b if runs == "a" else on_a
                canceled = await other.cancel_task(pb.CancelTaskRequest(id=second.id))
                assert canceled.status.state == pb.TASK_STATE_CANCELED
                running = daemons[names.index(runs)]
                await eventually(lambda: _stops_honoured(running), timeout=20, what="the turn stopped where it ran")
                assert (await state_of(on_a, second.id)).status.state == pb.TASK_STATE_CANCELED
        finally:
            await asyncio.gather(*(d.stop() for d in daemons if d.proc is not None and d.proc.returncode is None))
    with psycopg.connect(pg_url) as conn:
        stored = conn.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id").fetchall()
    assert stored == [("carry on elsewhere",), ("stop me from the other side",)]


async def test_a_task_taken_over_by_another_instance_whose_model_call_fails_ends_failed(tmp_path, pg_url):
    async with FakeModel() as model:
        model.script(Hang(), refusal(401))  # the call the kill cuts off, then the survivor's, refused
        names = ("a", "b")
        daemons = [Daemon(instance_dir(tmp_path, name), instance_settings(pg_url, name, model.base_url,
                                                                          cluster=FAST_FAILOVER, a2a=A2A))
                   for name in names]
        ports = [api_port(d) for d in daemons]
        await asyncio.gather(*(d.start() for d in daemons))
        try:
            async with connected(ports[0]) as on_a, connected(ports[1]) as on_b:
                task = await start_task(on_a, "fail elsewhere")
                await model.wait_for_requests(1)
                killed = names.index(await _holder(pg_url, task.context_id))
                await daemons[killed].kill()
                survivor = on_b if killed == 0 else on_a
                done = await eventually(lambda: ended(survivor, task.id), timeout=40, what="the task ended")
        finally:
            await asyncio.gather(*(d.stop() for d in daemons if d.proc is not None and d.proc.returncode is None))
    assert done.status.state == pb.TASK_STATE_FAILED, answer_of(done)
    assert "refused the API key" in done.status.message.parts[0].text and not done.artifacts


async def test_a_caller_subscribes_on_another_instance_than_the_one_running_its_task(tmp_path, pg_url):
    async with FakeModel() as model:
        release = asyncio.Event()
        model.script(Held(release))
        names = ("a", "b")
        daemons = [Daemon(instance_dir(tmp_path, name), instance_settings(pg_url, name, model.base_url,
                                                                          cluster=FAST_FAILOVER, a2a=A2A))
                   for name in names]
        ports = [api_port(d) for d in daemons]
        await asyncio.gather(*(d.start() for d in daemons))
        try:
            async with connected(ports[0]) as on_a:
                task = await start_task(on_a, "follow me from afar")
                await model.wait_for_requests(1)
                runs = await _holder(pg_url, task.context_id)
                elsewhere = ports[1] if runs == "a" else ports[0]
                async with connected(elsewhere, streaming=True) as client:
                    stream = client.subscribe(pb.SubscribeToTaskRequest(id=task.id))
                    attached = await stream.__anext__()
                    release.set()
                    rest = [event async for event in stream]
        finally:
            await asyncio.gather(*(d.stop() for d in daemons if d.proc is not None and d.proc.returncode is None))
    assert attached.task.id == task.id and attached.task.status.state == pb.TASK_STATE_WORKING
    chunks = [e.artifact_update for e in rest if e.HasField("artifact_update")]
    assert "".join(c.artifact.parts[0].text for c in chunks) == \
        "echo: follow me from afar | turns: 1 | first: follow me from afar"
    assert chunks[-1].last_chunk and rest[-1].status_update.status.state == pb.TASK_STATE_COMPLETED


async def _stops_honoured(daemon: Daemon) -> int:
    return (await health(daemon))["cluster"]["claims"]["stops_honoured"]


def api_port(daemon: Daemon) -> int:
    return int(yaml.safe_load(daemon.config.read_text())["api"]["port"])


async def _holder(url: str, context_id: str) -> str:
    """The instance whose lease holds the context's session now (the one running its turn)."""
    key = f"agent:main:a2a:planner:{context_id}"

    def read() -> str | None:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT l.holder FROM work_leases l JOIN routes r ON r.session_id = l.session_id "
                               "WHERE r.session_key = %s", (key,)).fetchone()
        return row[0] if row else None

    return await eventually(lambda: asyncio.to_thread(read), timeout=20, what="the lease on the task's session")
