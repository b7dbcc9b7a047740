"""The Matrix adapter against a real Synapse (tests/synapse.py): what users see, read back through its client API.

The real gateway (``Gateway(config)``, the adapter found through its entry point) and the fake model
talk to one Synapse started for the whole session; each test registers its own users, so the tests
share nothing but the server.  The fake homeserver (tests/fakes/matrix.py, through the conformance
kit) proves the faults; this proves the protocol: the invitation, a DM, a room, a thread, the
formatted body, streamed edits (m.replace), approval reactions (the asker's only), files through mxc://,
a restart that resumes from the stored next_batch; and end-to-end encryption against an encrypting
client (matrix-nio with its own crypto store, as Element would be): Ann's encrypted message read, the
bot's reply encrypted and read back decrypted, the same device and keys after a restart, only listed
devices given the room key with ``device_trust: verified``, and with ``encryption: false`` the room
told once that it is not read.

    .venv/bin/python -m pytest -q -n 0 tests/test_adapter_matrix_synapse.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from adapters.matrix.adapter import E2EE_NOTICE
from gateway.runtime.daemon import Gateway
from state.media_files import MediaFiles, sha256_of
from tests.crashkit import _stored
from tests.fakes import files
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import eventually, gateway_config
from tests.matrix_client import Encrypting
from tests.synapse import Client, Synapse, started_synapse, why_unavailable
from tests.voicekit import ogg_opus

WAIT = 30.0
LEDGER = str(Path(__file__).resolve().parent / "mcp_servers" / "ledger_server.py")


@pytest.fixture(scope="session")
def synapse(tmp_path_factory):
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    with started_synapse(tmp_path_factory.mktemp("synapse")) as hs:
        yield hs


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


class People:
    def __init__(self, hs: Synapse):
        tag = secrets.token_hex(3)
        self.bot, self.ann, self.bob, self.eve = (hs.register(f"{who}{tag}") for who in ("bot", "ann", "bob", "eve"))


@pytest.fixture
async def people(synapse) -> People:
    return await asyncio.to_thread(People, synapse)


def settings(synapse: Synapse, people: People, **extra) -> dict:
    return {"homeserver": synapse.base_url, "access_token": people.bot.token, "sync_timeout_seconds": 5,
            "allowed_users": [people.ann.user_id, people.bob.user_id], **extra}


@asynccontextmanager
async def gateway(tmp_path: Path, model: FakeModel, synapse: Synapse, people: People, *, home: str = "home",
                  matrix: dict | None = None, **overrides):
    config = gateway_config(tmp_path / home, model.base_url,
                            platforms={"matrix": settings(synapse, people, **(matrix or {}))}, **overrides)
    gw = Gateway(config, serve_api=False)
    await gw.start()
    try:
        await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", WAIT, "matrix connected")
        yield gw
    finally:
        await gw.stop(grace_seconds=5)


def shown(events: list[dict], bot: str, thread: str | None = None) -> list[dict]:
    """The bot's messages in ``events`` (a thread's only, or the room's main timeline), each the content a
    client shows: its last m.replace's new content."""
    edits: dict[str, dict] = {}
    out: list[tuple[str, dict]] = []
    for e in events:
        if e.get("type") != "m.room.message" or e.get("sender") != bot:
            continue
        rel = e["content"].get("m.relates_to") or {}
        if rel.get("rel_type") == "m.replace":
            edits[rel["event_id"]] = e["content"]["m.new_content"]
            continue
        in_thread = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
        if in_thread == thread:
            out.append((e["event_id"], e["content"]))
    return [edits.get(event_id, content) for event_id, content in out]


async def bodies(client: Client, room: str, bot: str, thread: str | None = None) -> list[str]:
    return [c.get("body", "") for c in shown(await asyncio.to_thread(client.messages, room), bot, thread)]


async def answered(client: Client, room: str, bot: str, text: str, thread: str | None = None) -> list[str]:
    seen: list[str] = []

    async def check() -> bool:
        seen[:] = await bodies(client, room, bot, thread)
        return any(b.startswith(f"echo: {text} |") for b in seen)

    await eventually(check, WAIT, lambda: f"the answer to {text!r} (shows {seen})", every=0.1)
    return seen


async def dm_room(people: People, who: Client | None = None) -> str:
    who = who or people.ann
    return await asyncio.to_thread(who.create_room, invite=[people.bot.user_id], direct=True)


async def joined(people: People, room: str) -> None:
    async def bot_in() -> bool:
        events = await asyncio.to_thread(people.ann.messages, room)
        return any(e["type"] == "m.room.member" and e.get("state_key") == people.bot.user_id
                   and e["content"].get("membership") == "join" for e in events)

    await eventually(bot_in, WAIT, "the bot to accept the invitation", every=0.1)


# --------------------------------------------------------------------------- conversations


async def test_a_dm_is_answered_with_html_from_the_markdown(synapse, people, tmp_path):
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people, streaming={"enabled": False}):
        room = await dm_room(people)
        await joined(people, room)
        await asyncio.to_thread(people.ann.say, room, "my name is Ann")
        await answered(people.ann, room, people.bot.user_id, "my name is Ann")
        model.script(Reply("Hello **Ann**, see `code`"))
        await asyncio.to_thread(people.ann.say, room, "format it")
        await eventually(lambda: len(model.requests) >= 2, WAIT, "the second turn")

        async def formatted() -> list[dict]:
            return shown(await asyncio.to_thread(people.ann.messages, room), people.bot.user_id)

        await eventually(lambda: _len_at_least(formatted, 2), WAIT, "the formatted reply")
        last = (await formatted())[-1]
    assert last["body"] == "Hello Ann, see code"
    assert last["format"] == "org.matrix.custom.html"
    assert last["formatted_body"] == "<p>Hello <strong>Ann</strong>, see <code>code</code></p>"


async def _len_at_least(get, n: int) -> bool:
    return len(await get()) >= n


async def test_a_room_answers_a_mention_only_and_keys_each_sender_apart(synapse, people, tmp_path):
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people) as gw:
        room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id, people.bob.user_id],
                                       name="Team")
        await asyncio.to_thread(people.bob.join, room)
        await joined(people, room)
        await asyncio.to_thread(people.ann.say, room, "just chatting, no bot here")
        await asyncio.to_thread(people.ann.say, room, f"{people.bot.user_id} hello from Ann",
                                **{"m.mentions": {"user_ids": [people.bot.user_id]}})
        await answered(people.ann, room, people.bot.user_id, "hello from Ann")
        await asyncio.to_thread(people.bob.say, room, f"{people.bot.user_id} hello from Bob",
                                **{"m.mentions": {"user_ids": [people.bot.user_id]}})
        shown_now = await answered(people.ann, room, people.bot.user_id, "hello from Bob")
        config = gw.config
    assert shown_now == ["echo: hello from Ann | turns: 1 | first: hello from Ann",
                         "echo: hello from Bob | turns: 1 | first: hello from Bob"]  # two sessions
    assert [r.last_user_text for r in model.requests] == ["hello from Ann", "hello from Bob"]
    assert _stored(config.db_path)["just chatting, no bot here"] == 0  # not addressed: never stored, never answered


async def test_a_thread_is_one_conversation_answered_in_the_thread(synapse, people, tmp_path):
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people):
        room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id, people.bob.user_id])
        await asyncio.to_thread(people.bob.join, room)
        await joined(people, room)
        root = await asyncio.to_thread(people.ann.say, room, "a topic to discuss")
        in_thread = {"m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                      "m.in_reply_to": {"event_id": root}},
                     "m.mentions": {"user_ids": [people.bot.user_id]}}
        await asyncio.to_thread(people.ann.say, room, f"{people.bot.user_id} in the thread", **in_thread)
        await answered(people.ann, room, people.bot.user_id, "in the thread", thread=root)
        await asyncio.to_thread(people.bob.say, room, f"{people.bot.user_id} me too", **in_thread)
        shown_now = await answered(people.ann, room, people.bot.user_id, "me too", thread=root)
        main = await bodies(people.ann, room, people.bot.user_id)
    assert shown_now == ["echo: in the thread | turns: 1 | first: in the thread",
                         "echo: me too | turns: 2 | first: in the thread"]
    assert main == []  # nothing in the room's main timeline


async def test_an_invitation_from_a_stranger_is_refused(synapse, people, tmp_path):
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people):
        strangers = await dm_room(people, people.eve)
        friends = await dm_room(people)
        await joined(people, friends)  # the allowed one is taken up; the stranger's came first
        events = await asyncio.to_thread(people.eve.messages, strangers)
    memberships = [e["content"]["membership"] for e in events
                   if e["type"] == "m.room.member" and e.get("state_key") == people.bot.user_id]
    assert memberships == ["invite", "leave"]
    assert model.requests == []


# --------------------------------------------------------------------------- streaming, approvals, files


async def test_a_streamed_reply_is_edited_in_place_with_m_replace(synapse, people, tmp_path):
    text = " ".join(f"word{i}" for i in range(150))
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people, streaming={"enabled": True}):
        model.stream_chunk_chars, model.stream_interval = 20, 0.05
        model.script(Reply(text))
        room = await dm_room(people)
        await joined(people, room)
        await asyncio.to_thread(people.ann.say, room, "stream it")

        async def whole() -> bool:
            return [b.strip() for b in await bodies(people.ann, room, people.bot.user_id)] == [text]

        await eventually(whole, WAIT, "the whole streamed reply", every=0.2)
        events = await asyncio.to_thread(people.ann.messages, room)
    edits = [e for e in events if e["type"] == "m.room.message" and e["sender"] == people.bot.user_id
             and (e["content"].get("m.relates_to") or {}).get("rel_type") == "m.replace"]
    assert len(edits) >= 1
    assert all(e["content"]["body"].startswith("* ") for e in edits)  # the fallback clients without edits show


async def test_an_approval_is_given_by_a_reaction(synapse, people, tmp_path):
    target = tmp_path / "ledger.txt"
    tools = {"mcp_servers": {"ledger": {"command": sys.executable, "args": [LEDGER], "allow": ["ledger__*"],
                                        "env": {"PYTHONCOERCECLOCALE": "0"}, "approval": "always"}}}
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people, tools=tools,
                                             streaming={"enabled": False}) as gw:
        server = gw.mcp.servers["ledger"]
        await eventually(lambda: server.available, WAIT, "the ledger server")
        model.script(ToolCall("ledger__append", {"text": "ship it", "path": str(target)}), Reply("shipped"))
        room = await dm_room(people)
        await joined(people, room)
        await asyncio.to_thread(people.ann.say, room, "ship it please")

        async def request() -> dict | None:
            events = await asyncio.to_thread(people.ann.messages, room)
            asked = [e for e in events if e["sender"] == people.bot.user_id and e["type"] == "m.room.message"
                     and "/approve " in e["content"].get("body", "")]
            offered = {e["content"]["m.relates_to"]["key"] for e in events if e["type"] == "m.reaction"
                       and asked and e["content"]["m.relates_to"]["event_id"] == asked[-1]["event_id"]}
            return asked[-1] if asked and offered == {"✅", "❌"} else None

        asked = await eventually(request, WAIT, "the approval request with ✅ and ❌ under it", every=0.1)
        assert not target.exists()
        await asyncio.to_thread(people.ann.send, room, {"m.relates_to": {
            "rel_type": "m.annotation", "event_id": asked["event_id"], "key": "✅"}}, "m.reaction")

        async def done() -> bool:
            return (await bodies(people.ann, room, people.bot.user_id))[-1:] == ["shipped"]

        await eventually(done, WAIT, "the approved call's answer", every=0.1)
    assert [json.loads(line)["text"] for line in target.read_text().splitlines()] == ["ship it"]


async def test_an_approval_is_answered_only_by_the_asker(synapse, people, tmp_path):
    target = tmp_path / "ledger.txt"
    tools = {"mcp_servers": {"ledger": {"command": sys.executable, "args": [LEDGER], "allow": ["ledger__*"],
                                        "env": {"PYTHONCOERCECLOCALE": "0"}, "approval": "always"}}}
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people, tools=tools,
                                             streaming={"enabled": False}) as gw:
        server = gw.mcp.servers["ledger"]
        await eventually(lambda: server.available, WAIT, "the ledger server")
        model.script(ToolCall("ledger__append", {"text": "ship it", "path": str(target)}), Reply("shipped"))
        room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id, people.bob.user_id])
        await asyncio.to_thread(people.bob.join, room)
        await joined(people, room)
        await asyncio.to_thread(people.ann.say, room, f"{people.bot.user_id} ship it please",
                                **{"m.mentions": {"user_ids": [people.bot.user_id]}})

        async def request() -> dict | None:
            events = await asyncio.to_thread(people.ann.messages, room)
            asked = [e for e in events if e["sender"] == people.bot.user_id and e["type"] == "m.room.message"
                     and "/approve " in e["content"].get("body", "")]
            offered = {e["content"]["m.relates_to"]["key"] for e in events if e["type"] == "m.reaction"
                       and asked and e["content"]["m.relates_to"]["event_id"] == asked[-1]["event_id"]}
            return asked[-1] if asked and offered == {"✅", "❌"} else None

        asked = await eventually(request, WAIT, "the approval request with ✅ and ❌ under it", every=0.1)
        tick = {"m.relates_to": {"rel_type": "m.annotation", "event_id": asked["event_id"], "key": "✅"}}
        await asyncio.to_thread(people.bob.send, room, tick, "m.reaction")

        async def refused() -> bool:
            return any(b.startswith("Only the person who asked, or an approver, can answer")
                       for b in await bodies(people.ann, room, people.bot.user_id))

        await eventually(refused, WAIT, "Bob told he cannot answer Ann's request", every=0.1)
        assert not target.exists()
        await asyncio.to_thread(people.ann.send, room, tick, "m.reaction")

        async def done() -> bool:
            return (await bodies(people.ann, room, people.bot.user_id))[-1:] == ["shipped"]

        await eventually(done, WAIT, "the call Ann approved answered", every=0.1)
    assert [json.loads(line)["text"] for line in target.read_text().splitlines()] == ["ship it"]


async def test_a_file_comes_through_mxc_into_the_media_store(synapse, people, tmp_path):
    pdf = files.pdf("Tickets go on sale on Friday")
    async with FakeModel() as model, gateway(tmp_path, model, synapse, people) as gw:
        room = await dm_room(people)
        await joined(people, room)
        uri = await asyncio.to_thread(people.ann.upload, pdf, "application/pdf", "sale.pdf")
        await asyncio.to_thread(people.ann.send, room, {"msgtype": "m.file", "body": "read this", "filename": "sale.pdf",
                                                        "url": uri, "info": {"mimetype": "application/pdf",
                                                                             "size": len(pdf)}})
        await eventually(lambda: model.requests, WAIT, "the file reached the model")
        media = MediaFiles(gw.config.media_path)
    assert media.exists(sha256_of(pdf)) and media.read(sha256_of(pdf)) == pdf
    assert "Tickets go on sale on Friday" in json.dumps(model.requests[-1].messages)


async def test_a_restart_resumes_from_the_stored_sync_token(synapse, people, tmp_path):
    async with FakeModel() as model:
        async with gateway(tmp_path, model, synapse, people):
            room = await dm_room(people)
            await joined(people, room)
            await asyncio.to_thread(people.ann.say, room, "before the restart")
            await answered(people.ann, room, people.bot.user_id, "before the restart")
        await asyncio.to_thread(people.ann.say, room, "while it was down")
        async with gateway(tmp_path, model, synapse, people) as gw:
            await answered(people.ann, room, people.bot.user_id, "while it was down")
            config = gw.config
        shown_now = await bodies(people.ann, room, people.bot.user_id)
    assert shown_now == ["echo: before the restart | turns: 1 | first: before the restart",
                         "echo: while it was down | turns: 2 | first: before the restart"]
    assert [r.last_user_text for r in model.requests] == ["before the restart", "while it was down"]
    assert _stored(config.db_path)["before the restart"] == 1


# --------------------------------------------------------------------------- encrypted rooms, encryption off


def megolm(n: int) -> dict:
    """What an encrypting client sends: the room key's session and the ciphertext (the bot has no key for it)."""
    return {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "c2VuZGVyX2tleV9vZl9hbm4", "device_id": "ANNPHONE",
            "session_id": "c2Vzc2lvbl9vZl9hbm4", "ciphertext": f"AwgAEoABbmV2ZXJfZGVjcnlwdGVk{n:04d}"}


async def test_with_encryption_off_an_encrypted_room_is_told_once_and_each_message_logged(synapse, people, tmp_path,
                                                                                        caplog):
    off = {"encryption": False}
    async with FakeModel() as model:
        async with gateway(tmp_path, model, synapse, people, matrix=off):
            room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id], direct=True,
                                           encrypted=True)
            await joined(people, room)
            for n in range(2):
                await asyncio.to_thread(people.ann.send, room, megolm(n), "m.room.encrypted")
            await asyncio.to_thread(people.ann.say, room, "a plain marker")  # read after both, in order
            await answered(people.ann, room, people.bot.user_id, "a plain marker")
        await asyncio.to_thread(people.ann.send, room, megolm(2), "m.room.encrypted")
        await asyncio.to_thread(people.ann.say, room, "after the restart")
        async with gateway(tmp_path, model, synapse, people, matrix=off):
            shown_now = await answered(people.ann, room, people.bot.user_id, "after the restart")
    assert [b for b in shown_now if not b.startswith("echo:")] == [E2EE_NOTICE]  # once, across a restart too
    logged = [r.getMessage() for r in caplog.records if "encrypted message" in r.getMessage()]
    assert len(logged) == 3 and all(room in line and people.ann.user_id in line for line in logged)
    assert [r.last_user_text for r in model.requests] == ["a plain marker", "after the restart"]


# --------------------------------------------------------------------------- end-to-end encryption


def bot_device(people: People) -> dict:
    """The bot's devices as any user's key query sees them: device id -> its ed25519 key."""
    found = people.ann.call("POST", "/keys/query", {"device_keys": {people.bot.user_id: []}})
    return {d: keys["keys"][f"ed25519:{d}"] for d, keys in found["device_keys"][people.bot.user_id].items()}


async def test_an_encrypted_dm_is_read_and_answered_encrypted_and_a_restart_keeps_the_device(synapse, people,
                                                                                            tmp_path):
    quiet = {"enabled": False}
    ann = Encrypting(people.ann, tmp_path / "ann-device")
    try:
        async with FakeModel() as model:
            async with gateway(tmp_path, model, synapse, people, streaming=quiet):
                room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id], direct=True,
                                               encrypted=True)
                await joined(people, room)
                await (await ann.open()).say(room, "a secret hello")
                first = await ann.answer(room, people.bot.user_id, "a secret hello")
                device_before = await asyncio.to_thread(bot_device, people)
            await ann.say(room, "after the restart")  # the same Megolm session: the bot kept its key
            async with gateway(tmp_path, model, synapse, people, streaming=quiet):
                second = await ann.answer(room, people.bot.user_id, "after the restart")
                device_after = await asyncio.to_thread(bot_device, people)
            raw = await asyncio.to_thread(people.ann.messages, room)
    finally:
        await ann.close()
    assert first == ["echo: a secret hello | turns: 1 | first: a secret hello"]
    assert second[-1] == "echo: after the restart | turns: 2 | first: a secret hello"
    assert [r.last_user_text for r in model.requests] == ["a secret hello", "after the restart"]
    from_bot = [e["type"] for e in raw if e["sender"] == people.bot.user_id
                and e["type"] in ("m.room.message", "m.room.encrypted")]
    assert from_bot == ["m.room.encrypted", "m.room.encrypted"]  # never a plaintext reply in the room
    assert not any("secret" in json.dumps(e["content"]) for e in raw)  # the server never saw a word of it
    assert device_before == device_after and len(device_before) == 1  # one device, the same keys


async def test_with_device_trust_verified_only_the_listed_devices_can_read_the_bot(synapse, people, tmp_path):
    ann = Encrypting(people.ann, tmp_path / "ann-device")
    bob = Encrypting(people.bob, tmp_path / "bob-device")
    try:
        await ann.open()
        await bob.open()
        device, key = ann.device
        trust = {"device_trust": "verified", "verified_devices": [f"{people.ann.user_id} {device} {key}"]}
        async with FakeModel() as model, gateway(tmp_path, model, synapse, people, streaming={"enabled": False},
                                                 matrix=trust):
            room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id, people.bob.user_id],
                                           encrypted=True)
            await asyncio.to_thread(people.bob.join, room)
            await joined(people, room)
            await ann.say(room, f"{people.bot.user_id} only for Ann")
            read = await ann.answer(room, people.bot.user_id, "only for Ann")
            await bob.sync()
    finally:
        await ann.close()
        await bob.close()
    assert read == ["echo: only for Ann | turns: 1 | first: only for Ann"]
    assert not any(who == people.bot.user_id for _, who, _ in bob.read)  # Bob's unlisted device got no key
    assert any(e.sender == people.bot.user_id for e in bob.unreadable)


async def test_a_message_whose_key_comes_late_is_kept_and_answered_once_it_comes(synapse, people, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="adapters.matrix.crypto")
    ann = Encrypting(people.ann, tmp_path / "ann-device")
    try:
        async with FakeModel() as model, gateway(tmp_path, model, synapse, people, streaming={"enabled": False}):
            room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id], direct=True,
                                           encrypted=True)
            await joined(people, room)
            await ann.open()
            key = await ann.withhold_key(room, people.bot.user_id)
            await ann.say(room, "sent before its key")

            def held() -> bool:
                return any("cannot be decrypted yet" in r.getMessage() and room in r.getMessage()
                           and people.ann.user_id in r.getMessage() for r in caplog.records)

            await eventually(held, WAIT, "the bot to keep the message it cannot decrypt and ask for its key")
            assert model.requests == []
            await ann.give_key(people.bot.user_id, key)
            read = await ann.answer(room, people.bot.user_id, "sent before its key")
    finally:
        await ann.close()
    assert read == ["echo: sent before its key | turns: 1 | first: sent before its key"]  # no notice: it was read
    assert [r.last_user_text for r in model.requests] == ["sent before its key"]
    assert any("decrypted once its key came" in r.getMessage() for r in caplog.records)


async def test_an_encrypted_voice_message_is_transcribed_and_the_spoken_reply_is_encrypted_too(synapse, people,
                                                                                              tmp_path):
    clip = ogg_opus(3)
    ann = Encrypting(people.ann, tmp_path / "ann-device")
    try:
        async with FakeModel() as model, gateway(tmp_path, model, synapse, people, streaming={"enabled": False},
                                                 media={"transcribe_with": "whisper-1", "speak_with": "tts-1"}):
            room = await asyncio.to_thread(people.ann.create_room, invite=[people.bot.user_id], direct=True,
                                           encrypted=True)
            await joined(people, room)
            await ann.open()
            model.transcript = "book a room for friday"
            await ann.send_voice(room, clip)
            heard = await ann.answer(room, people.bot.user_id, "[voice message, transcribed]\nbook a room for friday")
            await ann.say(room, "/voice on")
            await ann.say(room, "say something")

            async def spoken() -> bool:
                await ann.sync()
                return any(who == people.bot.user_id for _, who, _ in ann.audio)

            await eventually(spoken, WAIT, "the spoken reply, decrypted", every=0.2)
            [(_, _, voice)] = [a for a in ann.audio if a[1] == people.bot.user_id]
            held, played = await ann.fetch(voice)
            raw = await asyncio.to_thread(people.ann.messages, room)
    finally:
        await ann.close()
    assert model.transcriptions[0]["file"]["data"] == clip  # the bot decrypted the file it downloaded
    assert heard[0].startswith("echo: [voice message, transcribed]\nbook a room for friday")
    assert played.startswith(b"OggS") and held != played  # the server holds only the ciphertext
    assert "org.matrix.msc3245.voice" in voice.source["content"]
    assert {e["type"] for e in raw if e["sender"] == people.bot.user_id and e["type"].startswith("m.room.")
            and e["type"] not in ("m.room.member",)} == {"m.room.encrypted"}
