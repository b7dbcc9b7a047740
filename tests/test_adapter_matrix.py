"""The Matrix adapter's own rules against the fake homeserver (tests/fakes/matrix.py): log-in, the stored
sync token, refused tokens, rate limits on /sync, invitations, encrypted rooms.  The conformance kit
(tests/test_platform_kit.py -k matrix) and the real Synapse (tests/test_adapter_matrix_synapse.py)
cover the conversations.

    .venv/bin/python -m pytest -q -n 0 tests/test_adapter_matrix.py
"""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest
import yaml
from click.testing import CliRunner

from adapters.matrix.adapter import CREDENTIALS, E2EE_NOTICE, MatrixAdapter, MemoryState
from adapters.matrix.config import MatrixConfig
from adapters.matrix.crypto import PENDING, PICKLE_KEY
from gateway.cli.main import main
from gateway.errors import TokenRejected
from gateway.runtime.cluster import connection_key
from gateway.runtime.daemon import Gateway, platform_summary
from tests.adapter_config import configured
from tests.fakes.matrix import BOT, SERVER, FakeMatrix
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, gateway_config
from tests.voicekit import ogg_opus

ANN = f"@ann:{SERVER}"
EVE = f"@eve:{SERVER}"
WAIT = 15.0


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


class Inbox:
    def __init__(self):
        self.messages = []

    async def __call__(self, msg):
        self.messages.append(msg)
        return True

    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


def adapter(hs: FakeMatrix, tmp_path, **kw) -> tuple[MatrixAdapter, MemoryState]:
    a = configured(MatrixAdapter, MatrixConfig, homeserver=hs.base_url, sync_timeout_seconds=2,
                   **({"access_token": hs.token} | kw))
    state = MemoryState(tmp_path / "platforms" / "matrix")
    a.keep_state_in(state)
    return a, state


async def test_a_refused_token_fails_the_start_naming_the_key(tmp_path):
    async with FakeMatrix() as hs:
        a, _ = adapter(hs, tmp_path, access_token="syt_wrong")  # its folder in tmp_path, not the cwd
        with pytest.raises(TokenRejected, match="the token was rejected.*M_UNKNOWN_TOKEN.*platforms.matrix.access_token"):
            await a.start(Inbox())
        assert a.health().state == "failed"
        assert [c.path for c in hs.calls if c.path.endswith("/sync")] == []


async def test_a_token_revoked_while_running_stops_the_sync_and_says_so(tmp_path):
    async with FakeMatrix() as hs:
        a, _ = adapter(hs, tmp_path)
        await a.start(Inbox())
        try:
            hs.refuse_token()
            await eventually(lambda: a.health().state == "failed", WAIT, "the adapter to give up")
            assert "the token was rejected" in (a.health().last_error or "")
            assert "M_UNKNOWN_TOKEN" in (a.health().last_error or "")
            task = a._sync_task  # white box: the loop itself ended, so nothing is retried
            await eventually(lambda: task is not None and task.done(), WAIT, "the sync loop to end")
            syncs = hs.syncs
            hs.message(hs.dm_room(ANN), ANN, "anyone there?")
            assert hs.syncs == syncs
        finally:
            await a.stop()
    assert hs.token_in_query == 0  # the token travels in the Authorization header only


async def test_a_rate_limited_sync_waits_what_the_server_asked(tmp_path):
    async with FakeMatrix() as hs:
        a, _ = adapter(hs, tmp_path)
        inbox = Inbox()
        await a.start(inbox)
        try:
            hs.fail_next("sync", status=429, retry_after_ms=800)
            hs.message(hs.dm_room(ANN), ANN, "after the limit")
            await eventually(lambda: inbox.texts() == ["after the limit"], WAIT, "the message")
        finally:
            await a.stop()
    syncs = [c for c in hs.calls if c.path.endswith("/sync")]
    limited = next(i for i, c in enumerate(syncs) if c.status == 429)
    assert syncs[limited + 1].at - syncs[limited].at >= 0.75


async def test_the_sync_token_is_kept_and_a_restart_takes_nothing_twice(tmp_path):
    async with FakeMatrix() as hs:
        room = hs.dm_room(ANN)
        first, state = adapter(hs, tmp_path)
        inbox = Inbox()
        await first.start(inbox)
        hs.message(room, ANN, "one")
        await eventually(lambda: inbox.texts() == ["one"], WAIT, "the first message")
        await eventually(lambda: state.values.get("next_batch") == f"s{len(hs.stream.events)}", WAIT, "the token kept")
        await first.stop()
        hs.message(room, ANN, "while it was down")
        second = MatrixAdapter(MatrixConfig(homeserver=hs.base_url, access_token=hs.token, sync_timeout_seconds=2))
        second.keep_state_in(state)
        await second.start(inbox)
        try:
            await eventually(lambda: len(inbox.texts()) == 2, WAIT, "the message written while it was down")
        finally:
            await second.stop()
    assert inbox.texts() == ["one", "while it was down"]
    assert hs.sync_since[0] is None and state.values["next_batch"] in hs.sync_since


async def test_a_password_login_is_kept_private_and_used_again(tmp_path):
    async with FakeMatrix() as hs:
        for _ in range(2):
            a, state = adapter(hs, tmp_path, access_token="", password=hs.password, user_id=BOT)
            await a.start(Inbox())
            await a.stop()
        path = state.directory / CREDENTIALS
        assert hs.logins == 1  # the second start is the same device, from the kept token
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert '"device_id": "FAKEDEVICE"' in path.read_text()


async def test_invitations_are_taken_up_from_allowed_users_only(tmp_path):
    async with FakeMatrix() as hs:
        a, _ = adapter(hs, tmp_path, allowed_users=[ANN])
        await a.start(Inbox())
        try:
            hs.invite(f"!from-eve:{SERVER}", EVE)
            hs.invite(f"!from-ann:{SERVER}", ANN)
            await eventually(lambda: BOT in hs.rooms.get(f"!from-ann:{SERVER}", type("R", (), {"members": []})).members,
                             WAIT, "the bot to join Ann's room")
            await eventually(lambda: hs.left == [f"!from-eve:{SERVER}"], WAIT, "Eve's invitation refused")
        finally:
            await a.stop()
    assert f"!from-eve:{SERVER}" not in hs.rooms


def megolm(n: int) -> dict:
    """An encrypted event's content from a device whose room key never reached the bot."""
    return {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "c2VuZGVyX2tleV9vZl9hbm4", "device_id": "ANNPHONE",
            "session_id": f"c2Vzc2lvbl9vZl9hbm4{n}", "ciphertext": "AwgAEoABbmV2ZXJfZGVjcnlwdGVk"}


async def test_with_encryption_off_an_encrypted_room_is_told_once_and_every_message_logged(tmp_path, caplog):
    async with FakeMatrix() as hs:
        room = hs.room(f"!secret:{SERVER}", [ANN], encrypted=True).room_id
        a, state = adapter(hs, tmp_path, encryption=False)
        inbox = Inbox()
        await a.start(inbox)
        try:
            for _ in range(3):
                hs.event(room, ANN, "m.room.encrypted", {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA"})
            hs.message(hs.dm_room(ANN), ANN, "marker")
            await eventually(lambda: inbox.texts() == ["marker"], WAIT, "the marker")
        finally:
            await a.stop()
    assert hs.shown(room) == [E2EE_NOTICE]  # once, however many came
    assert state.values[f"e2ee_told:{room}"] == "1"  # and not again after a restart
    assert sum("encrypted message" in r.getMessage() for r in caplog.records) == 3
    assert inbox.messages[0].text == "marker"


async def test_a_cluster_runs_one_sync_per_account():
    one = MatrixConfig(homeserver="https://m.example.org", user_id="@bot:example.org", access_token="syt_a")
    again = MatrixConfig(homeserver="https://m.example.org", user_id="@bot:example.org", access_token="syt_b")
    other = MatrixConfig(homeserver="https://m.example.org", user_id="@other:example.org", access_token="syt_a")
    assert connection_key("matrix", one) == connection_key("matrix", again) != connection_key("matrix", other)
    assert "syt_a" not in (connection_key("matrix", one) or "")


async def test_the_gateway_keeps_the_sync_token_in_the_store(tmp_path):
    async with FakeMatrix() as hs, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": [f"matrix:{ANN}"]},
                                platforms={"matrix": {"homeserver": hs.base_url, "access_token": hs.token,
                                                      "sync_timeout_seconds": 2}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", WAIT, "connected")
            hs.message(hs.dm_room(ANN), ANN, "hello")
            await eventually(lambda: hs.shown(hs.dm_room(ANN)), WAIT, "the answer")
            kept = await gw.db.prefs.get("adapter:matrix", "next_batch")
        finally:
            await gw.stop(grace_seconds=5)
    assert kept is not None and kept.startswith("s") and kept in hs.sync_since + [f"s{len(hs.stream.events)}"]


async def test_a_voice_message_is_transcribed_and_a_spoken_reply_sent_as_voice(tmp_path):
    async with FakeMatrix() as hs, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": [f"matrix:{ANN}"]},
                                platforms={"matrix": {"homeserver": hs.base_url, "access_token": hs.token,
                                                      "sync_timeout_seconds": 2}},
                                media={"transcribe_with": "whisper-1", "speak_with": "tts-1"},
                                streaming={"enabled": False})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", WAIT, "connected")
            room = hs.dm_room(ANN)
            model.transcript = "book a room for friday"
            clip = ogg_opus(3)
            hs.event(room, ANN, "m.room.message", {
                "msgtype": "m.audio", "body": "Voice message", "url": hs.add_media(clip, "audio/ogg"),
                "info": {"mimetype": "audio/ogg", "size": len(clip), "duration": 3000},
                "org.matrix.msc1767.audio": {"duration": 3000}, "org.matrix.msc3245.voice": {}})
            await eventually(lambda: hs.shown(room), WAIT, "the answer to the voice message")
            answer = hs.shown(room)[0]
            hs.message(room, ANN, "/voice on")
            await eventually(lambda: len(hs.shown(room)) >= 2, WAIT, "/voice on answered")
            hs.message(room, ANN, "say something")
            await eventually(lambda: any(s.type == "m.room.message" and s.content.get("msgtype") == "m.audio"
                                         for s in hs.sent), WAIT, "the spoken reply")
        finally:
            await gw.stop(grace_seconds=5)
    assert answer.startswith("echo: [voice message, transcribed]\nbook a room for friday")
    assert model.transcriptions[0]["file"]["data"] == clip
    [voice] = [s for s in hs.sent if s.content.get("msgtype") == "m.audio"]
    assert "org.matrix.msc3245.voice" in voice.content and voice.content["url"].startswith("mxc://")


async def test_the_daemon_does_not_retry_a_refused_token(tmp_path):
    async with FakeMatrix() as hs, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url,
                                platforms={"matrix": {"homeserver": hs.base_url, "access_token": "syt_wrong"}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: "matrix" in gw.rejected_platforms, WAIT, "matrix rejected")
            summary = platform_summary(gw, "matrix")
            asked = [c for c in hs.calls if c.path.endswith("/whoami")]
        finally:
            await gw.stop(grace_seconds=5)
    assert summary == "failed: the token was rejected"
    assert len(asked) == 1 and asked[0].status == 401  # asked once, never again


async def test_doctor_asks_the_homeserver_whether_the_token_works(tmp_path):
    async with FakeMatrix() as hs, FakeModel() as model:
        outputs = {}
        for name, token in (("good", hs.token), ("bad", "syt_revoked_token_0000")):
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump({"home": str(tmp_path / name), "model": {"base_url": model.base_url,
                                                                                  "name": "fake-model"},
                                            "platforms": {"matrix": {"homeserver": hs.base_url,
                                                                     "access_token": token}}}))
            result = await asyncio.to_thread(CliRunner().invoke, main, ["doctor", "--config", str(path)],
                                             env={"HTTP_PROXY": "", "HTTPS_PROXY": ""})
            outputs[name] = next(line for line in result.output.splitlines() if line[2:].startswith("matrix:"))
            assert token not in result.output  # never printed
    assert outputs["good"] == f"✓ matrix: token valid ({BOT})"
    assert outputs["bad"].startswith("✗ matrix: the token was refused (HTTP 401)")


async def test_an_undecryptable_message_asks_for_its_key_is_kept_and_the_room_is_told_once(tmp_path, caplog):
    async with FakeMatrix() as hs:
        room = hs.room(f"!secret:{SERVER}", [ANN], encrypted=True).room_id
        a, state = adapter(hs, tmp_path, key_wait_seconds=0.5)
        inbox = Inbox()
        await a.start(inbox)
        try:
            for n in range(3):
                hs.event(room, ANN, "m.room.encrypted", megolm(n))
            await eventually(lambda: state.values.get(f"e2ee_told:{room}") == "1", WAIT, "the room told")
            hs.message(hs.dm_room(ANN), ANN, "marker")  # a later /sync: nothing told twice
            await eventually(lambda: inbox.texts() == ["marker"], WAIT, "the marker")
        finally:
            await a.stop()
    requests = [m for kind, m in hs.to_device if kind == "m.room_key_request"]
    asked = {r["body"]["session_id"] for m in requests for r in m[BOT].values()}
    assert asked == {megolm(n)["session_id"] for n in range(3)}  # each session's key asked of Ann's devices
    told = [s for s in hs.sent if s.room_id == room]
    assert [s.type for s in told] == ["m.room.encrypted"]  # once, and encrypted as the room is
    logged = [r.getMessage() for r in caplog.records if "cannot be decrypted yet" in r.getMessage()]
    assert len(logged) == 3 and all(room in line and ANN in line for line in logged)
    assert len(json.loads(state.values[PENDING])) == 3  # still kept: a key that comes later still reads them


async def test_the_device_keeps_its_keys_private_in_the_home_across_a_restart(tmp_path):
    async with FakeMatrix() as hs:
        first, state = adapter(hs, tmp_path)
        await first.start(Inbox())
        uploaded = hs.device_keys["FAKEDEVICE"]
        await first.stop()
        again, _ = adapter(hs, tmp_path)
        await again.start(Inbox())
        await again.stop()
        uploads = [c for c in hs.calls if c.path.endswith("/keys/upload")]
    assert hs.device_keys["FAKEDEVICE"] == uploaded  # the same identity: never a second set of keys
    assert all(c.status == 200 for c in uploads)
    home = state.directory
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    files = sorted(p.name for p in home.iterdir())
    assert PICKLE_KEY in files and f"{BOT}_FAKEDEVICE.db" in files
    assert all(stat.S_IMODE(os.stat(home / f).st_mode) == 0o600 for f in files)


def test_encryption_with_a_cluster_is_refused_at_the_config_check(tmp_path):
    platforms = {"matrix": {"homeserver": "https://m.example.org", "access_token": "syt_a"}}
    with pytest.raises(Exception, match=r"platforms\.matrix\.encryption.*cannot share the device's crypto store"):
        gateway_config(tmp_path, "http://127.0.0.1:9", platforms=platforms, store={"url": "postgresql://x@h/db"})
    off = {"matrix": {**platforms["matrix"], "encryption": False}}
    assert gateway_config(tmp_path, "http://127.0.0.1:9", platforms=off, store={"url": "postgresql://x@h/db"})


def test_verified_devices_are_checked_at_the_config_check(tmp_path):
    base = {"homeserver": "https://m.example.org", "access_token": "syt_a", "device_trust": "verified"}

    def load(**matrix):
        return gateway_config(tmp_path, "http://127.0.0.1:9", platforms={"matrix": {**base, **matrix}})

    with pytest.raises(Exception, match=r"platforms\.matrix\.verified_devices.*is empty but device_trust is verified"):
        load()
    with pytest.raises(Exception, match=r'platforms\.matrix\.verified_devices\[0\]: must be "@ann:example.org DEVICEID <its'):
        load(verified_devices=["ANNPHONE abcd"])
    ok = load(verified_devices=["@ann:example.org ANNPHONE abcd efgh"])  # the key grouped, as Element shows it
    assert ok.platforms.matrix.verified_devices == ("@ann:example.org ANNPHONE abcd efgh",)
