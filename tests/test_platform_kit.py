"""The platform conformance kit: every installed platform, through its fake, passes the same checks.

Each check runs the real gateway (``Gateway(config)``, which finds the adapter through its entry
point and builds it with ``from_config``) against the platform's fake (tests/platformkit) and the
fake model, and asserts what the users see in their chats and what the store holds.  A check the
platform cannot pass by its nature is skipped, the reason naming the capability
(``PlatformConfig.CAPABILITIES``): ``-rs`` lists them.

    .venv/bin/python -m pytest -q -n 2 tests/test_platform_kit.py              # every platform
    .venv/bin/python -m pytest -q tests/test_platform_kit.py -k webhook -rs    # one, with the skips
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config import platform_models
from gateway.platforms import installed_platforms
from gateway.runtime.daemon import Gateway
from gateway.types import Capabilities
from state.media_files import MediaFiles, sha256_of
from tests.crashkit import ChaosRun, _stored
from tests.fakes import files
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import eventually, gateway_config, stored_routes
from tests.platformkit import FakePlatform, NotApplicable, fake_for, kit_platforms, without_fake

PLATFORMS = kit_platforms()
LEDGER = str(Path(__file__).resolve().parent / "mcp_servers" / "ledger_server.py")
WAIT = 20.0


@pytest.fixture(params=PLATFORMS)
async def fake(request):
    async with fake_for(request.param) as f:
        yield f


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def needs(fake: FakePlatform, capability: str) -> Capabilities:
    caps = fake.capabilities
    if not getattr(caps, capability):
        pytest.skip(f"not applicable: {fake.name} declares {capability}=False (PlatformConfig.CAPABILITIES)")
    return caps


@asynccontextmanager
async def gateway(fake: FakePlatform, tmp_path: Path, model: FakeModel, **overrides):
    allowed = [f"{fake.name}:{fake.user_id(who)}" for who in ("ann", "bob")]
    config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": allowed},
                            platforms={fake.name: fake.settings()}, **overrides)
    gw = Gateway(config, serve_api=fake.serve_api)
    await gw.start()
    try:
        fake.attach(gw)
        await fake.ready(gw)
        yield gw
    finally:
        await gw.stop(grace_seconds=5)


def _brief(shown: list[str]) -> list[str]:
    return [s if len(s) < 120 else f"{s[:100]}... ({len(s)} chars)" for s in shown]


async def shows(fake: FakePlatform, chat: str, n: int, what: str = "", timeout: float = WAIT) -> list[str]:
    """Until ``chat`` shows ``n`` bot messages; returns them all."""
    await eventually(lambda: len(fake.shown(chat)) >= n, timeout,
                     lambda: f"{n} messages in {fake.name} chat {chat} {what} (shows {_brief(fake.shown(chat))})")
    return fake.shown(chat)


async def answered(fake: FakePlatform, chat: str, text: str, timeout: float = WAIT) -> list[str]:
    """Until ``chat`` shows the echo of ``text``; returns what it shows."""
    await eventually(lambda: any(s.startswith(f"echo: {text} |") for s in fake.shown(chat)), timeout,
                     lambda: f"the answer to {text!r} in {fake.name} chat {chat} (shows {_brief(fake.shown(chat))})")
    return fake.shown(chat)


def echo(text: str, turns: int = 1, first: str | None = None) -> str:
    return f"echo: {text} | turns: {turns} | first: {first or text}"


def test_every_installed_platform_has_a_fake_and_declares_its_capabilities():
    assert without_fake() == [], "these installed platforms have no fake for the kit (see docs/platforms.md)"
    assert PLATFORMS == list(installed_platforms())
    for name in PLATFORMS:
        caps = platform_models()[name].CAPABILITIES
        assert caps != Capabilities(), f"{name} declares no capabilities (PlatformConfig.CAPABILITIES)"


# --------------------------------------------------------------------------- conversations


async def test_a_dm_is_answered(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        first = await fake.dm("ann", "my name is Ann")
        await answered(fake, first.chat, "my name is Ann")
        await fake.dm("ann", "what is my name?")
        shown = await answered(fake, first.chat, "what is my name?")
        config = gw.config
    assert shown == [echo("my name is Ann"), echo("what is my name?", 2, "my name is Ann")]
    assert stored_routes(config) == [first.key]


async def test_two_users_in_a_group_are_keyed_apart(fake, tmp_path):
    needs(fake, "groups")
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        ann = await fake.group("ann", "hello from Ann")
        await answered(fake, ann.chat, "hello from Ann")
        bob = await fake.group("bob", "hello from Bob")
        await answered(fake, bob.chat, "hello from Bob")
        config = gw.config
    assert ann.key != bob.key
    assert echo("hello from Ann") in fake.shown(ann.chat) and echo("hello from Bob") in fake.shown(bob.chat)
    assert stored_routes(config) == sorted([ann.key, bob.key])


async def test_a_thread_is_keyed_as_a_thread(fake, tmp_path):
    needs(fake, "threads")
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        first = await fake.thread("ann", "in the thread")
        await answered(fake, first.chat, "in the thread")
        second = await fake.thread("bob", "me too")
        shown = await answered(fake, second.chat, "me too")
        config = gw.config
    assert first.chat == second.chat and first.key == second.key
    assert shown == [echo("in the thread"), echo("me too", 2, "in the thread")]  # one shared conversation
    assert stored_routes(config) == [first.key]


async def test_a_stranger_is_refused_and_offered_pairing(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        in_group = await fake.group("eve", "let me in") if fake.capabilities.groups else None
        dm = await fake.dm("eve", "hello?")
        [offer] = await shows(fake, dm.chat, 1, "(the pairing offer)")
        marker = await fake.dm("ann", "marker")
        await answered(fake, marker.chat, "marker")
        config = gw.config
    assert f"switchboard pairing approve {fake.name} " in offer
    if in_group is not None:
        assert fake.shown(in_group.chat) == []  # nothing said in the group
    assert [r.last_user_text for r in model.requests] == ["marker"]  # the stranger never reached the model
    assert stored_routes(config) == [marker.key]


async def test_a_duplicate_an_edit_and_an_out_of_order_delivery_are_each_answered_once(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        first = await fake.dm("ann", "only once please")
        await answered(fake, first.chat, "only once please")
        await fake.redeliver(first)
        try:
            await fake.edit(first, "changed my mind")
        except NotApplicable:
            pass
        await fake.out_of_order("ann", ("early bird", "late bird"))
        await eventually(lambda: len(model.requests) >= 2, WAIT, "the out-of-order pair reached the model")
        await fake.dm("ann", "last")
        await answered(fake, first.chat, "last")
        config = gw.config
    stored = _stored(config.db_path)
    assert {t: stored[t] for t in ("only once please", "early bird", "late bird", "last")} == {
        "only once please": 1, "early bird": 1, "late bird": 1, "last": 1}
    assert stored["changed my mind"] == 0  # an edit is not a new message
    once = [s for s in fake.shown(first.chat) if s.startswith("echo: only once please |")]
    assert once == [echo("only once please")]
    assert fake.shown(first.chat)[-1].endswith("| turns: 4 | first: only once please")  # all four, once each


# --------------------------------------------------------------------------- faults


async def test_a_429_is_waited_out_and_the_reply_sent_once(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model, streaming={"enabled": False}):
        fake.fail_sends(1, status=429, retry_after=1.0)
        first = await fake.dm("ann", "through the rate limit")
        await answered(fake, first.chat, "through the rate limit")
        times = fake.send_times(first.chat)
        await fake.dm("ann", "marker")
        shown = await answered(fake, first.chat, "marker")
    assert shown == [echo("through the rate limit"), echo("marker", 2, "through the rate limit")]
    assert len(times) == 2 and times[1] - times[0] >= 0.9, times  # the refused send, then one after retry-after


async def test_a_5xx_a_slow_send_and_a_dropped_connection_cost_no_reply_and_send_none_twice(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model, streaming={"enabled": False}) as gw:
        fake.fail_sends(1, status=500)
        first = await fake.dm("ann", "after a 500")
        await answered(fake, first.chat, "after a 500")
        fake.slow_sends(2.0)
        await fake.dm("ann", "slowly")
        await answered(fake, first.chat, "slowly")
        await fake.drop_connection()
        await fake.ready(gw)
        await fake.dm("ann", "after the drop")
        shown = await answered(fake, first.chat, "after the drop")
    assert shown == [echo("after a 500"), echo("slowly", 2, "after a 500"), echo("after the drop", 3, "after a 500")]


# --------------------------------------------------------------------------- replies


def _long_text(caps: Capabilities) -> str:
    rng = random.Random(38)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "naïve",
             "smörgåsbord", "🙂", "日本語"]
    lines, size = [], 0
    while size < caps.max_message_length * 2.5:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + "."
        lines.append(line)
        size += caps.length(line) + 1
        if rng.random() < 0.2:
            lines.append("")
    return "\n".join(lines)


async def test_a_long_reply_is_split_within_the_limit_and_rebuilt_exactly(fake, tmp_path):
    caps = fake.capabilities
    text = _long_text(caps)
    async with FakeModel() as model, gateway(fake, tmp_path, model, streaming={"enabled": False}):
        model.script(Reply(text))
        first = await fake.dm("ann", "tell me everything")
        parts_needed = -(-caps.length(text) // caps.max_message_length)
        await shows(fake, first.chat, parts_needed, "(the long reply's parts)")
        await fake.dm("ann", "marker")
        shown = await answered(fake, first.chat, "marker")
    parts = shown[:-1]
    assert len(parts) >= parts_needed
    assert max(caps.length(p) for p in parts) <= caps.max_message_length
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())  # every word, in order, once


def _within_budget(times: list[float], caps: Capabilities, slack: float = 0.15) -> list[str]:
    """The pairs of calls that a token bucket of ``caps.chat_rate`` and ``caps.chat_burst`` could not allow."""
    out = []
    for i in range(len(times)):
        for j in range(i + caps.chat_burst, len(times)):
            calls = j - i + 1
            if calls > caps.chat_burst + caps.chat_rate * (times[j] - times[i] + slack):
                out.append(f"{calls} calls in {times[j] - times[i]:.2f} s")
    return out


async def test_a_streamed_reply_keeps_the_chats_rate_budget(fake, tmp_path):
    caps = fake.capabilities
    text = " ".join(f"word{i}" for i in range(120))
    async with FakeModel() as model, gateway(fake, tmp_path, model, streaming={"enabled": True}):
        model.stream_chunk_chars, model.stream_interval = 10, 0.06  # about 4 s of writing
        model.script(Reply(text))
        first = await fake.dm("ann", "stream it")
        await eventually(lambda: any(s.strip() == text for s in fake.shown(first.chat)), WAIT,
                         lambda: f"the whole streamed reply (shows {fake.shown(first.chat)})")
        times = fake.send_times(first.chat)
        edits = fake.edits(first.chat)
    assert fake.shown(first.chat) == [text]
    if caps.edits:
        assert edits >= 1, "a streamed reply on a platform that edits is shown as it is written"
    else:
        assert edits == 0 and len(times) == 1, "a platform that cannot edit gets the reply whole, once"
    assert _within_budget(times, caps) == [], times


async def test_an_approval_is_answered_with_buttons_or_approve(fake, tmp_path):
    target = tmp_path / "ledger.txt"
    tools = {"mcp_servers": {"ledger": {"command": sys.executable, "args": [LEDGER], "allow": ["ledger__*"],
                                        "env": {"PYTHONCOERCECLOCALE": "0"}, "approval": "always"}}}
    async with FakeModel() as model, gateway(fake, tmp_path, model, tools=tools, streaming={"enabled": False}) as gw:
        server = gw.mcp.servers["ledger"]
        await eventually(lambda: server.available, WAIT, lambda: f"ledger ready ({server.state}: {server.last_error})")
        model.script(ToolCall("ledger__append", {"text": "ship it", "path": str(target)}), Reply("shipped"))
        first = await fake.dm("ann", "ship it please")
        [request] = await shows(fake, first.chat, 1, "(the approval request)")
        rid = re.search(r"/approve (\S+)", request + " ".join(fake.buttons(first.chat)))
        assert rid, f"the request names no /approve command: {request!r} {fake.buttons(first.chat)}"
        assert "ledger__append" in request and not target.exists()
        if fake.capabilities.buttons:
            approve = [b for b in fake.buttons(first.chat) if b.startswith("/approve ")]
            assert approve, f"{fake.name} declares buttons but the request has none: {fake.buttons(first.chat)}"
            await fake.press("ann", first.chat, approve[0])
        else:
            await fake.dm("ann", f"/approve {rid.group(1)}")
        await eventually(lambda: fake.shown(first.chat)[-1:] == ["shipped"], WAIT,
                         lambda: f"the approved call's answer (shows {fake.shown(first.chat)})")
    assert [json.loads(line)["text"] for line in target.read_text().splitlines()] == ["ship it"]


async def test_an_attachment_is_kept_in_the_media_store(fake, tmp_path):
    needs(fake, "files")
    pdf = files.pdf("Tickets go on sale on Friday")
    async with FakeModel() as model, gateway(fake, tmp_path, model) as gw:
        first = await fake.attachment("ann", "read this", "sale.pdf", pdf, "application/pdf")
        await shows(fake, first.chat, 1, "(the answer to the file)")
        media = MediaFiles(gw.config.media_path)
    assert media.exists(sha256_of(pdf)) and media.read(sha256_of(pdf)) == pdf
    shown_to_model = json.dumps(model.requests[-1].messages)
    assert "Tickets go on sale on Friday" in shown_to_model and "sale.pdf" in shown_to_model


# --------------------------------------------------------------------------- hostile input


async def test_hostile_input_harms_nothing(fake, tmp_path):
    async with FakeModel() as model, gateway(fake, tmp_path, model, streaming={"enabled": False}) as gw:
        count = await fake.malformed()
        surrogate = await fake.dm("ann", "lone \ud800 surrogate and NUL \x00 here")
        await shows(fake, surrogate.chat, 1, "(the answer to the surrogate)")
        model.script(Reply("that was long"))  # the echo of 100 KB would take minutes to send at the chat's rate
        await fake.dm("ann", "x" * 100_000)
        await eventually(lambda: "that was long" in fake.shown(surrogate.chat), WAIT,
                         lambda: f"the answer to 100 KB (shows {_brief(fake.shown(surrogate.chat))})")
        await fake.dm("ann", "still here")
        shown = await answered(fake, surrogate.chat, "still here")
        health = gw.health()["platforms"][fake.name]["state"]
        config = gw.config
    assert count >= 3
    assert health == "connected"
    stored = _stored(config.db_path)
    assert not [t for t in stored if "\x00" in t or re.search(r"[\ud800-\udfff]", t)]
    assert any("\ufffd" in t and "surrogate" in t for t in stored), list(stored)[:5]
    assert shown[-1].startswith("echo: still here |")
    assert all(len(s) <= 2 * fake.capabilities.max_message_length for s in shown)


# --------------------------------------------------------------------------- kill -9


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("CHAOS_SEED") or random.randrange(1_000_000))


@pytest.mark.timeout(300)  # a daemon started twice and a burst settled: email's takes 66 s alone, twice that under load
async def test_kill_9_under_a_burst_and_a_restart_loses_nothing_and_doubles_only_sends_in_flight(fake, tmp_path, seed):
    async with FakeModel(delay=0.15) as model:
        plan = fake.chaos_plan(seed)
        kill_when = None if plan.kill_on_send else (lambda: model.in_flight > 0)
        outcome = await ChaosRun(fake.crash_side(), tmp_path, model.base_url, plan, kill_when=kill_when).run()
    if outcome.problems():
        pytest.fail(outcome.report(), pytrace=False)
    print(outcome.report())
    assert outcome.figures()["stored twice"] == 0 and outcome.figures()["answered"] >= 1, outcome.report()
