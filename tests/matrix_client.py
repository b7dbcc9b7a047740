"""An encrypting Matrix client for the tests against Synapse: matrix-nio with its own crypto store, as Element is.

    ann = await Encrypting(people.ann, tmp_path / "ann-device").open()   # the user's registered device
    await ann.say(room, "hello")                 # encrypted (Megolm), the room key shared with the bot
    await ann.answer(room, bot, "hello")         # the bot's messages as this client decrypted them

It syncs by hand, as a client's loop does (keys uploaded, queried and claimed, to-device messages
sent), keeps what it could decrypt (``read``, ``audio``) and what it could not yet (``unreadable``),
and can hold a room key back from a user's devices and hand it over late (``withhold_key``,
``give_key``), which is how a key that comes after its message looks to the bot.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nio import (
    AsyncClient,
    AsyncClientConfig,
    MegolmEvent,
    RoomEncryptedAudio,
    RoomMessageText,
    RoomSendResponse,
    SyncResponse,
    ToDeviceMessage,
)
from nio.crypto.attachments import decrypt_attachment
from nio.store import SqliteStore

from tests.synapse import Client
from tests.waiting import eventually

WAIT = 30.0


class Encrypting:
    """One user's encrypting client: matrix-nio with its own crypto store on the user's registered device, synced
    by hand as a client would (keys uploaded, queried and claimed, to-device messages sent)."""

    def __init__(self, who: Client, store: Path):
        self.who = who
        self.store = store
        self.nio: AsyncClient | None = None
        self.read: list[tuple[str, str, str]] = []  # (room, sender, body) of every message it could decrypt
        self.unreadable: list[MegolmEvent] = []
        self.audio: list[tuple[str, str, RoomEncryptedAudio]] = []  # the encrypted voice messages it decrypted

    async def open(self) -> "Encrypting":
        me = await asyncio.to_thread(self.who.call, "GET", "/account/whoami")
        self.store.mkdir(parents=True, exist_ok=True)
        self.nio = AsyncClient(self.who.base, self.who.user_id, store_path=str(self.store),
                               config=AsyncClientConfig(encryption_enabled=True, store=SqliteStore,
                                                        store_sync_tokens=False))
        self.nio.restore_login(self.who.user_id, me["device_id"], self.who.token)
        await self.sync()
        return self

    @property
    def device(self) -> tuple[str, str]:
        assert self.nio is not None and self.nio.olm is not None
        return self.nio.device_id, self.nio.olm.account.identity_keys["ed25519"]

    async def sync(self) -> None:
        nio = self.nio
        assert nio is not None
        resp = await nio.sync(timeout=200, full_state=nio.next_batch is None or None)
        assert isinstance(resp, SyncResponse), resp
        if nio.should_upload_keys:
            await nio.keys_upload()
        if nio.should_query_keys:
            await nio.keys_query()
        if nio.should_claim_keys:
            await nio.keys_claim(nio.get_users_for_key_claiming())
        await nio.send_to_device_messages()
        events = [(room_id, e) for room_id, info in resp.rooms.join.items() for e in info.timeline.events]
        waiting, self.unreadable = self.unreadable, []
        for event in waiting:
            try:
                events.append((event.room_id, nio.decrypt_event(event)))
            except Exception:  # noqa: BLE001 - still no key for it
                self.unreadable.append(event)
        for room_id, event in events:
            if isinstance(event, MegolmEvent):
                event.room_id = room_id
                self.unreadable.append(event)
            elif isinstance(event, RoomMessageText):
                self.read.append((room_id, event.sender, event.body))
            elif isinstance(event, RoomEncryptedAudio):
                self.audio.append((room_id, event.sender, event))

    async def say(self, room: str, text: str) -> None:
        await self.send(room, {"msgtype": "m.text", "body": text})

    async def send(self, room: str, content: dict) -> None:
        assert self.nio is not None
        await self.sync()
        resp = await self.nio.room_send(room, "m.room.message", content, ignore_unverified_devices=True)
        assert isinstance(resp, RoomSendResponse), resp

    async def send_voice(self, room: str, clip: bytes) -> None:
        """A voice message as Element sends one into an encrypted room: the file uploaded encrypted."""
        assert self.nio is not None
        resp, keys = await self.nio.upload(lambda *_: clip, content_type="audio/ogg", filename="voice.ogg",
                                           encrypt=True, filesize=len(clip))
        await self.send(room, {"msgtype": "m.audio", "body": "Voice message", "file": {**keys, "url": resp.content_uri},
                               "info": {"mimetype": "audio/ogg", "size": len(clip), "duration": 3000},
                               "org.matrix.msc1767.audio": {"duration": 3000}, "org.matrix.msc3245.voice": {}})

    async def fetch(self, audio: RoomEncryptedAudio) -> tuple[bytes, bytes]:
        """An encrypted voice message's file: (as the content repository holds it, decrypted)."""
        assert self.nio is not None
        resp = await self.nio.download(mxc=audio.url)
        held = bytes(resp.body)
        return held, decrypt_attachment(held, audio.key["k"], audio.hashes["sha256"], audio.iv)

    async def answer(self, room: str, bot: str, text: str) -> list[str]:
        """The bot's messages in ``room`` as this client decrypted them, once the answer to ``text`` is one."""
        async def came() -> bool:
            await self.sync()
            return any(b.startswith(f"echo: {text} |") for r, who, b in self.read if r == room and who == bot)

        await eventually(came, WAIT, lambda: f"the decrypted answer to {text!r} (read {self.read})", every=0.2)
        return [b for r, who, b in self.read if r == room and who == bot]

    async def close(self) -> None:
        if self.nio is not None:
            await self.nio.close()

    async def withhold_key(self, room: str, user: str) -> dict:
        """Start the room's Megolm session without giving ``user``'s devices its key (blacklisted, as a client
        that shares with verified devices only would); the key, at its first message, for later."""
        nio = self.nio
        assert nio is not None and nio.olm is not None
        await self.sync()
        for device in nio.device_store.active_user_devices(user):
            nio.blacklist_device(device)
        await nio.joined_members(room)
        await nio.share_group_session(room, ignore_unverified_devices=True)
        session = nio.olm.outbound_group_sessions[room]
        return {"algorithm": "m.megolm.v1.aes-sha2", "room_id": room, "session_id": session.id,
                "session_key": session.session_key}

    async def give_key(self, user: str, key: dict) -> None:
        """The withheld room key, late, to each of ``user``'s devices over Olm (an ``m.room_key``)."""
        nio = self.nio
        assert nio is not None and nio.olm is not None
        devices = list(nio.device_store.active_user_devices(user))
        await nio.keys_claim({user: [d.id for d in devices]})
        for device in devices:
            nio.unblacklist_device(device)
            session = nio.olm.session_store.get(device.curve25519)
            payload = nio.olm._olm_encrypt(session, device, "m.room_key", key)
            await nio.to_device(ToDeviceMessage("m.room.encrypted", user, device.id, payload))
