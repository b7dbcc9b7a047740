"""Microsoft Teams beyond the conformance kit: what the Bot Framework checks, against tests/fakes/teams.py.

The real adapter (aiohttp and PyJWT) takes activities on its messaging endpoint, served as the local
API serves it (tests/platform_paths.py: the real PlatformHttp on 127.0.0.1); the fake signs
activities with its own key, publishes it through its OpenID metadata and JWKS, issues the bot's
tokens and checks them on every connector call.
"""

from __future__ import annotations

import asyncio

import pytest

from adapters.teams import TeamsAdapter
from adapters.teams.config import MESSAGES_PATH, TeamsConfig
from adapters.teams.format import to_teams
from gateway.runtime.daemon import Gateway
from gateway.types import Button, ChatRef, ChatType, InboundMessage
from tests.adapter_config import configured
from tests.fakes.model_server import FakeModel
from tests.fakes.teams import FakeTeams
from tests.harness import gateway_config, stored_routes
from tests.platform_paths import serving
from tests.waiting import eventually

_RUNNING: dict[int, TeamsAdapter] = {}  # id(fake) -> the adapter its endpoint reaches


@pytest.fixture
async def teams():
    async with FakeTeams() as fake:
        async with serving("teams", lambda: _RUNNING.get(id(fake))) as base:
            fake.endpoint = base + MESSAGES_PATH
            try:
                yield fake
            finally:
                _RUNNING.pop(id(fake), None)


def _adapter(teams: FakeTeams, **overrides) -> TeamsAdapter:
    settings = dict(app_id=teams.app_id, app_password=teams.app_password,
                    openid_metadata_url=teams.metadata_url, issuer=teams.issuer, token_url=teams.token_url,
                    service_url=teams.service_url)
    settings.update(overrides)
    return configured(TeamsAdapter, TeamsConfig, **settings)


class Inbox:
    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.fail = 0

    async def __call__(self, msg: InboundMessage) -> bool:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the store is down")
        self.messages.append(msg)
        return True


async def _started(teams: FakeTeams, inbox: Inbox, **overrides) -> TeamsAdapter:
    adapter = _adapter(teams, **overrides)
    await adapter.start(inbox)
    _RUNNING[id(teams)] = adapter
    return adapter


async def test_only_activities_signed_with_a_published_key_for_our_app_reach_the_gateway(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        good = teams.activity(conversation="a:dm-ann", user="29:ann", text="hello")
        headers_for = {
            "unsigned": dict(signed=False),
            "signed with a key nobody published": dict(wrong_key=True),
            "not a JWT": dict(token="Bearer not.a.jwt"),
            "another app's audience": dict(token="Bearer " + teams.sign(good, audience="someone-else")),
            "expired an hour ago": dict(token="Bearer " + teams.sign(good, expires_in=-3600)),
        }
        statuses = {what: await teams.post(dict(good, id=f"1{i}"), **how) for i, (what, how) in enumerate(headers_for.items())}
        # a token lifted from an activity for another serviceUrl
        lifted = teams.sign(dict(good, serviceUrl="https://elsewhere.example/"))
        statuses["for another serviceUrl"] = await teams.post(dict(good, id="19"), token=f"Bearer {lifted}")
        assert await teams.post(good) == 200
    finally:
        await adapter.stop()
    assert statuses == dict.fromkeys(statuses, 401)
    assert [m.text for m in inbox.messages] == ["hello"]
    assert adapter.unauthorized == 6


async def test_a_rotated_signing_key_is_fetched_when_a_token_names_it(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        reads = sum(1 for c in teams.calls if c.method == "keys")
        teams.rotate_keys()
        assert await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="after rotation")) == 200
        # a made-up key id again at once does not read the keys again (at most once every 30 s)
        assert await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="x"), wrong_key=True) == 401
    finally:
        await adapter.stop()
    assert [m.text for m in inbox.messages] == ["after rotation"]
    assert sum(1 for c in teams.calls if c.method == "keys") == reads + 1


async def test_a_redelivered_activity_is_handed_over_once_and_a_failed_one_is_sent_again(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        activity = teams.activity(conversation="a:dm-ann", user="29:ann", text="once")
        inbox.fail = 1
        assert await teams.post(activity) == 500  # not stored: the Bot Framework sends it again
        assert await teams.post(activity) == 200
        assert await teams.post(activity) == 200
    finally:
        await adapter.stop()
    assert [m.text for m in inbox.messages] == ["once"]


async def test_chats_are_keyed_like_dms_groups_and_threads_and_mentions_are_stripped(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="in private"))
        await teams.post(teams.activity(conversation="19:g@thread.v2", user="29:ann", text="hi all", kind="groupChat",
                                        mention=True))
        await teams.post(teams.activity(conversation="19:g@thread.v2", user="29:bob", text="not to the bot",
                                        kind="groupChat"))
        await teams.post(teams.activity(conversation="19:c@thread.tacv2;messageid=42", user="29:bob", text="in a thread",
                                        kind="channel", mention=True))
    finally:
        await adapter.stop()
    got = [(m.chat_type, m.chat_id, m.thread_id, m.text, m.addressed) for m in inbox.messages]
    assert got == [
        (ChatType.DM, "a:dm-ann", None, "in private", True),
        (ChatType.GROUP, "19:g@thread.v2", None, "hi all", True),
        (ChatType.GROUP, "19:g@thread.v2", None, "not to the bot", False),
        (ChatType.THREAD, "19:c@thread.tacv2", "42", "in a thread", True),
    ]


async def test_replies_split_edit_in_place_and_carry_cards_with_one_cached_token(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    chat = ChatRef("teams", "19:c@thread.tacv2", "42")
    try:
        await teams.post(teams.activity(conversation="19:c@thread.tacv2;messageid=42", user="29:bob", text="go",
                                        kind="channel", mention=True))
        await adapter.send_typing(chat)  # a typing activity only takes a slot the replies leave free
        long = "\n\n".join(f"paragraph {i} " + "word " * 150 for i in range(12))
        delivery = await adapter.send(chat, long)
        draft = await adapter.post_draft(chat, "writing", reply_to=None, final=False)
        await adapter.edit_draft(chat, draft, "**written**", final=True)
        card = await adapter.send_buttons(chat, "Run `ledger__append`?", (Button("Approve", "/approve 3f9a"),
                                                                           Button("Deny", "/deny 3f9a", "danger")))
    finally:
        await adapter.stop()
    shown = teams.shown("19:c@thread.tacv2;messageid=42")  # the typing activity is not a message
    assert delivery.ok and len(delivery.message_ids) >= 2 and all(len(s.activity["text"]) <= 4000 for s in shown)
    assert " ".join(" ".join(s.text for s in shown[:-2]).split()) == " ".join(long.split())
    assert shown[-2].text == "written" and shown[-2].edits == 1 and shown[-2].activity["textFormat"] == "markdown"
    assert card.ok and shown[-1].commands == ["/approve 3f9a", "/deny 3f9a"]
    assert teams.tokens_issued() == 1
    assert any(c.method == "typing" and c.status == 200 for c in teams.calls)


async def test_a_card_press_comes_in_as_the_presser_typing_the_command(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="", value={"switchboard": "/approve 3f9a"}))
        await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="", value={"other": "app"}))
    finally:
        await adapter.stop()
    assert [(m.user_id, m.text) for m in inbox.messages] == [("29:ann", "/approve 3f9a"), ("29:ann", "")]


async def test_an_expired_token_is_fetched_again(teams):
    teams.token_lifetime = 301  # the adapter fetches a new one 1 s after (300 s before it expires)
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        await adapter.send(ChatRef("teams", "a:dm-ann"), "one")
        await asyncio.sleep(1.1)
        await adapter.send(ChatRef("teams", "a:dm-ann"), "two")
    finally:
        await adapter.stop()
    assert [s.text for s in teams.shown("a:dm-ann")] == ["one", "two"]
    assert teams.tokens_issued() == 2


async def test_a_rejected_app_secret_stops_trying_and_says_what_to_fix(teams):
    inbox = Inbox()
    adapter = _adapter(teams, app_password="an-old-secret")
    await adapter.start(inbox)
    _RUNNING[id(teams)] = adapter
    try:
        state, error = adapter.health().state, adapter.health().last_error
        # activities it could not answer are refused for now (the Bot Framework sends them again later)
        refused = await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="hi"))
        delivery = await adapter.send(ChatRef("teams", "a:dm-ann"), "hello")
        again = await adapter.send(ChatRef("teams", "a:dm-ann"), "hello")
    finally:
        await adapter.stop()
    assert state == "failed"
    assert "rejected the bot's app id or secret (invalid_client 7000215)" in error
    assert "platforms.teams.app_password" in error and "an-old-secret" not in error
    assert refused == 503
    assert not delivery.ok and delivery.retry_later and delivery.error == error and again == delivery
    assert teams.tokens_issued() == 1  # asked once, never again


async def test_a_429_is_waited_out_before_the_reply_goes_again(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        teams.fail_next(1, status=429, retry_after=1.0)
        delivery = await adapter.send(ChatRef("teams", "a:dm-ann"), "patiently")
    finally:
        await adapter.stop()
    times = teams.times("a:dm-ann")
    assert delivery.ok and [s.text for s in teams.shown("a:dm-ann")] == ["patiently"]
    assert len(times) == 2 and times[1] - times[0] >= 0.95


async def test_files_are_downloaded_into_the_message(teams):
    inbox = Inbox()
    adapter = await _started(teams, inbox)
    try:
        url = teams.add_file("notes.txt", b"remember the milk")
        await teams.post(teams.activity(conversation="a:dm-ann", user="29:ann", text="read this", attachments=[
            {"contentType": "application/vnd.microsoft.teams.file.download.info", "name": "notes.txt",
             "content": {"downloadUrl": url, "fileType": "txt"}},
            {"contentType": "application/vnd.microsoft.teams.file.download.info", "name": "evil.txt",
             "content": {"downloadUrl": "http://169.254.169.254/latest/meta-data", "fileType": "txt"}}]))
        await eventually(lambda: inbox.messages, 5, "the message")
    finally:
        await adapter.stop()
    [msg] = inbox.messages
    assert [(a.name, a.kind, a.data) for a in msg.attachments] == [("notes.txt", "document", b"remember the milk"),
                                                                   ("evil.txt", "document", None)]


def test_markdown_is_written_as_teams_renders_it():
    text = "# Plan\n\n**bold**, *it*, ~~gone~~, `x<y`, a <tag> & [link](https://e.x)\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    assert to_teams(text) == (
        "**Plan**\n\n**bold**, *it*, ~~gone~~, `x<y`, a &lt;tag&gt; &amp; [link](https://e.x)\n\n- one\n- two\n\n"
        "```\n| a | b |\n|---|---|\n| 1 | 2 |\n```")


async def test_only_the_asker_or_an_approver_can_answer_an_approval_card(tmp_path):
    import json
    import re
    import sys

    from tests.fakes.model_server import FakeModel, Reply, ToolCall
    from tests.platformkit.teams import TeamsKit
    from tests.test_platform_kit import LEDGER, WAIT, gateway, shows

    target = tmp_path / "ledger.txt"
    tools = {"mcp_servers": {"ledger": {"command": sys.executable, "args": [LEDGER], "allow": ["ledger__*"],
                                        "env": {"PYTHONCOERCECLOCALE": "0"}, "approval": "always"}}}
    async with TeamsKit() as kit, FakeModel() as model, \
            gateway(kit, tmp_path, model, tools=tools, streaming={"enabled": False}) as gw:
        server = gw.mcp.servers["ledger"]
        await eventually(lambda: server.available, WAIT, lambda: f"ledger ready ({server.state}: {server.last_error})")
        model.script(ToolCall("ledger__append", {"text": "ship it", "path": str(target)}), Reply("shipped"))
        asked = await kit.thread("ann", "ship it please")  # a channel thread: one conversation for everyone in it
        [request] = await shows(kit, asked.chat, 1, "(the approval card)")
        approve = [b for b in kit.buttons(asked.chat) if b.startswith("/approve ")]
        assert re.search(r"ledger__append", request) and approve
        await kit.press("bob", asked.chat, approve[0])  # allowed to talk to the bot, but not the one who asked
        [_, refusal] = await shows(kit, asked.chat, 2, "(bob's press refused)")
        assert refusal.startswith("Only the person who asked, or an approver, can answer") and not target.exists()
        await kit.press("ann", asked.chat, approve[0])
        await eventually(lambda: kit.shown(asked.chat)[-1:] == ["shipped"], WAIT,
                         lambda: f"the approved call's answer (shows {kit.shown(asked.chat)})")
    assert [json.loads(line)["text"] for line in target.read_text().splitlines()] == ["ship it"]


async def test_the_daemons_listener_takes_only_signed_activities_and_its_api_token_opens_nothing(tmp_path):
    api_token = "sk-api-token-for-the-other-endpoints"
    async with FakeTeams() as teams, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, api={"token": api_token}, auth={"allowed_users": ["teams:29:ann"]},
            platforms={"teams": {"app_id": teams.app_id, "app_password": teams.app_password,
                                 "openid_metadata_url": teams.metadata_url, "token_url": teams.token_url,
                                 "service_url": teams.service_url}})
        gw = Gateway(config, serve_api=True)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["teams"]["state"] == "connected", 15, "teams connected")
            teams.endpoint = f"http://127.0.0.1:{gw.api.bound_port}{MESSAGES_PATH}"
            good = teams.activity(conversation="a:dm-ann", user="29:ann", text="hello")
            refused = [await teams.post(dict(good, id="161", text="unsigned"), signed=False),
                       await teams.post(dict(good, id="162", text="wrong key"), wrong_key=True),
                       await teams.post(dict(good, id="163", text="api token"), token=f"Bearer {api_token}")]
            assert await teams.post(good) == 200
            [reply] = await teams.wait_for_messages("a:dm-ann", 1, timeout=20)
        finally:
            await gw.stop(grace_seconds=5)
    assert refused == [401, 401, 401]
    assert reply.text == "echo: hello | turns: 1 | first: hello"  # the model saw only the signed one
    assert stored_routes(config) == ["agent:main:teams:dm:a%3Adm-ann"]
    assert len(model.requests) == 1
