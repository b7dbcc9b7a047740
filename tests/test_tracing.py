"""OpenTelemetry traces (the switchboard[otel] extra): the real daemon exports one trace per turn by
OTLP over HTTP to a receiver in this process, which decodes the protobuf ExportTraceServiceRequest as
a collector would.  One platform turn with a tool call is checked whole: the tree of spans, their
order, the GenAI attributes, no message text, and the trace id in the turn's log lines, in the rows it
stored and on the dashboard's transcript."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gateway import tracing
from gateway.types import InboundMessage
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, running_gateway
from tests.test_dashboard import TOKEN, Browser

SECRET_TEXT = "my locker code is 4711"


class OtlpReceiver:
    """``POST /v1/traces`` on 127.0.0.1, port 0: every span received, decoded, with its resource."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.resources: list[dict] = []
        self.content_types: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> "OtlpReceiver":
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            self.resources.append({a.key: _value(a.value) for a in resource_spans.resource.attributes})
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append({
                        "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex() or None, "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano, "kind": span.kind,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "events": [e.name for e in span.events], "status": span.status.code,
                        "links": [link.span_id.hex() for link in span.links],
                    })
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


def _value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


async def test_one_platform_turn_with_a_tool_call_is_one_trace(tmp_path, monkeypatch):
    async with OtlpReceiver() as otlp, FakeTelegram() as tg, FakeModel() as model:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        side = TelegramSide(tg)
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-traces-not-a-secret"},
            "auth": {"allow_all": True}, "logging": {"level": "INFO", "format": "text"}, **side.settings()})
        model.script(ToolCall("memory", {"target": "user", "action": "add", "content": "likes tea"}, call_id="call_m1"))
        start = await daemon.start()
        try:
            await side.ready(start, 20)
            tg.dm(tg.user(4242, "Ada"), SECRET_TEXT)
            await tg.wait_for(lambda: any(SECRET_TEXT in m.visible_text for m in tg.sent), 30, "the answer")
        finally:
            assert await daemon.stop() == 0  # the last spans are sent at exit
        # the same home served by an in-process gateway: traces off there (only `switchboard run` turns them
        # on), its dashboard shows the Telegram turn, and an API turn it answers itself stores no trace id
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
        async with running_gateway(daemon.home, model, ui={"enabled": True}, api={"token": TOKEN}) as gw:
            assert await ApiClient(gw).say("untraced", "hello without traces")
            with sqlite3.connect(daemon.db_path) as conn:
                stored = conn.execute("SELECT s.source, s.id, m.role, m.trace_id FROM messages m "
                                      "JOIN sessions s ON s.id = m.session_id ORDER BY m.id").fetchall()
            browser = Browser(gw)
            try:
                await browser.login(TOKEN)
                (telegram_session,) = {sid for source, sid, _, _ in stored if source == "telegram"}
                (api_session,) = {sid for source, sid, _, _ in stored if source == "api"}
                _, traced_page, _ = await browser.get(f"/ui/sessions/{telegram_session}")
                _, untraced_page, _ = await browser.get(f"/ui/sessions/{api_session}")
                _, export, _ = await browser.get(f"/ui/sessions/{telegram_session}/export.json")
            finally:
                await browser.close()
    log = daemon.log_path(0).read_text()
    assert otlp.content_types == {"application/x-protobuf"}
    assert otlp.resources[0]["service.name"] == "switchboard"

    roots = [s for s in otlp.spans if s["name"] == "inbound telegram"]
    assert len(roots) == 1, [s["name"] for s in otlp.spans]
    root = roots[0]
    spans = [s for s in otlp.spans if s["trace"] == root["trace"]]
    by_id = {s["id"]: s for s in spans}
    assert root["parent"] is None
    assert root["attributes"] == {"switchboard.platform": "telegram", "switchboard.chat.type": "dm"}

    def children(span: dict) -> list[dict]:
        return sorted((s for s in spans if s["parent"] == span["id"]), key=lambda s: s["start"])

    (turn,) = [s for s in children(root) if s["name"] == "turn"]
    # the store's writes, each an event on the span it happened in (a span only when slow or failed)
    # the message stored: tried where the route points, with its turn's context (its chat's lane is idle), then,
    # the chat having no session yet, in the one started for it
    writes = root["events"] + [s["name"] for s in children(root)]
    assert "store Turns.store_then_context" in writes and "store Messages.append_inbound" in writes
    steps = [s["name"] for s in children(turn) if not s["name"].startswith("store ")]
    # the tool loop as it happened: a model call asking for the tool, the tool, the answering call;
    # the sends to Telegram between them (streamed: the tool's status line as a draft) and after
    assert [n for n in steps if n != "send telegram"] == ["chat fake-model", "execute_tool memory",
                                                         "chat fake-model"], steps
    assert steps[-1] == "send telegram", steps
    assert {s["attributes"]["switchboard.send"] for s in children(turn) if s["name"] == "send telegram"} <= \
        {"draft", "edit", "message"}
    assert "store Messages.record_turn" in turn["events"] + [s["name"] for s in children(turn)]  # the answer stored
    first_call, tool, second_call = (next(s for s in children(turn) if s["name"] == n and s["start"] >= after)
                                     for n, after in (("chat fake-model", 0), ("execute_tool memory", 0),
                                                      ("chat fake-model", children(turn)[0]["end"])))
    assert first_call["end"] <= tool["start"] <= tool["end"] <= second_call["start"]
    assert first_call["attributes"]["gen_ai.request.model"] == "fake-model"
    assert first_call["attributes"]["gen_ai.operation.name"] == "chat"
    assert first_call["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert second_call["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    assert second_call["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert second_call["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert "gen_ai.first_token" in second_call["events"]  # streamed
    assert tool["attributes"] == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "memory",
                                  "gen_ai.tool.call.id": "call_m1"}
    assert all(by_id.get(s["parent"]) is not None for s in spans if s is not root)  # one connected tree
    # message text never in a span without telemetry.include_content
    assert not [s for s in otlp.spans for v in s["attributes"].values() if "locker" in str(v) or "tea" in str(v)]
    # the trace id in the turn's log lines: the memory tool's own line, for one
    memory_lines = [line for line in log.splitlines() if "memory add on" in line]
    assert memory_lines and all(f"trace_id={root['trace']}" in line for line in memory_lines), log[-2000:]

    # the turn's trace id stored with what it wrote (the tool call, the tool's result, the reply), not with
    # the user's message (stored before the turn); with traces off, none
    assert [(role, trace_id) for source, _, role, trace_id in stored if source == "telegram"] == [
        ("user", None), ("assistant", root["trace"]), ("tool", root["trace"]), ("assistant", root["trace"])]
    assert [(role, trace_id) for source, _, role, trace_id in stored if source == "api"] == [
        ("user", None), ("assistant", None)]
    # on the dashboard: beside the reply, the whole id to copy (shown cut short), and in the export
    reply = re.findall(r'<div class="message assistant"[^>]*>\s*<div class="head">(.*?)</div>', traced_page, re.S)[-1]
    assert f'trace <code>{root["trace"]}</code>' in reply and f'title="the trace of the turn that wrote this: ' \
        f'{root["trace"]}"' in reply, reply
    assert "trace <code>" not in untraced_page
    assert [m.get("trace_id") for m in json.loads(export)["messages"]] == [None] + [root["trace"]] * 3


async def test_include_content_puts_the_text_in_and_tracing_off_costs_nothing():
    msg = InboundMessage(platform="telegram", chat_type="dm", chat_id="1", user_id="1", text=SECRET_TEXT)
    assert tracing.setup(env={}) is False  # no endpoint: off
    assert tracing.inbound(msg) is tracing.NOOP and tracing.send("telegram") is tracing.NOOP
    assert tracing.current_trace_id() is None
    async with OtlpReceiver() as otlp:
        assert tracing.setup(include_content=True, env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url})
        try:
            with tracing.inbound(msg) as root:
                assert tracing.current_trace_id() == format(root.context.trace_id, "032x")
            with tracing.turn([root.context], platform="telegram"):
                with tracing.model_call("m", "127.0.0.1", [{"role": "user", "content": SECRET_TEXT}]) as call:
                    call.finished(input_tokens=3, output_tokens=2, finish_reason="stop", text="noted: 4711")
                with tracing.tool_call("memory", "c1", {"content": SECRET_TEXT}) as tool:
                    tool.result("saved 4711")
        finally:
            await asyncio.to_thread(tracing.shutdown)
    attributes = {s["name"]: s["attributes"] for s in otlp.spans}
    assert attributes["inbound telegram"]["switchboard.message.text"] == SECRET_TEXT
    assert SECRET_TEXT in attributes["chat m"]["gen_ai.input.messages"]
    assert "noted: 4711" in attributes["chat m"]["gen_ai.output.messages"]
    assert SECRET_TEXT in attributes["execute_tool memory"]["gen_ai.tool.call.arguments"]
    assert attributes["execute_tool memory"]["gen_ai.tool.call.result"] == "saved 4711"
    assert tracing.enabled() is False and tracing.inbound(msg) is tracing.NOOP  # shut down: off again


async def test_a_store_write_is_an_event_unless_it_was_slow_or_failed():
    msg = InboundMessage(platform="telegram", chat_type="dm", chat_id="1", user_id="1", text="hi")
    async with OtlpReceiver() as otlp:
        assert tracing.setup(env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url})
        try:
            assert tracing.store_write("append_message") is tracing.NOOP  # outside a turn: nothing
            with tracing.inbound(msg):
                with tracing.store_write("append_inbound_to_route"):
                    pass
                with tracing.store_write("record_turn"):
                    await asyncio.sleep(tracing.SLOW_STORE_WRITE_SECONDS * 1.5)  # a write that took long
                with pytest.raises(RuntimeError), tracing.store_write("set_title"):
                    raise RuntimeError("disk full")
        finally:
            await asyncio.to_thread(tracing.shutdown)
    by_name = {s["name"]: s for s in otlp.spans}
    assert set(by_name) == {"inbound telegram", "store record_turn", "store set_title"}
    root = by_name["inbound telegram"]
    assert root["events"] == ["store append_inbound_to_route"]
    slow, failed = by_name["store record_turn"], by_name["store set_title"]
    assert slow["parent"] == failed["parent"] == root["id"]
    assert slow["end"] - slow["start"] >= tracing.SLOW_STORE_WRITE_SECONDS * 1e9
    assert slow["attributes"] == {"db.operation.name": "record_turn"} and slow["status"] == 0
    assert failed["attributes"] == {"db.operation.name": "set_title", "error.type": "RuntimeError"}
    assert failed["status"] == 2  # STATUS_CODE_ERROR


@pytest.fixture(autouse=True)
def _tracing_off_after():
    yield
    tracing.shutdown()
