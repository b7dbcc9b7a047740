"""End-to-end encrypted rooms: matrix-nio's Olm machine (vodozemac), driven from our own /sync loop.

Why this shape: nio decrypts inside ``AsyncClient.sync`` (its ``receive_response`` takes the
to-device room keys into the crypto store, then swaps each Megolm event of the timeline for its
plaintext), so the sync loop still hands the timeline over event by event, in order, and moves
``next_batch`` on only after (``sync``).  What ``sync_forever`` would do besides is done here, after
every /sync (:meth:`Crypto.maintain`): the device's one-time keys uploaded when the server runs low,
the room members' device keys queried, one-time keys claimed for new devices, the to-device messages
nio queued (key requests, shares) sent.

The device: its identity keys, Olm and Megolm sessions live in nio's ``SqliteStore`` in
``<home>/platforms/matrix/`` (``<user>_<device>.db``, mode 0600 in a 0700 folder), pickled under a
random key kept beside it (``pickle.key``, 0600).  The same access token (or the password login's
kept token) is the same device, so a restart finds the same keys and never uploads new ones.  A
store that cannot be opened fails the start, saying what to do; it is never replaced silently (that
would be a new identity for a device every peer already knows).

Sharing room keys (``platforms.matrix.device_trust``): ``tofu``, every device of the room's members
gets the keys, its keys pinned the first time the bot sees them (nio refuses a device whose signing
key changes later); ``verified``, only the devices listed in ``verified_devices`` (user, device id,
session key) are verified, every other is blacklisted, so it never gets a key (the bot's replies
show as undecryptable there).  Messages are read from every device either way: the homeserver
authenticates the sender, the device trust only decides who can read the bot.  nio has no
cross-signing and no interactive (SAS) verification here, so "verified" is the operator's list, and
the bot's own device is not cross-signed: Element marks its messages as from an unverified session.

An event that cannot be decrypted (no Megolm session for it on this device) is never dropped: the
key is requested from the sender's devices (``m.room_key_request``), room and sender are logged, and
the event is kept in the store (:data:`PENDING`); after every /sync it is tried again and, once its
key came, delivered like any other.  Still undecryptable after ``key_wait`` seconds, the room is told
once (remembered in the store, as before).  Kept events older than a day are let go, logged.

The event loop: nio writes its store as it handles each response (the few rows of keys it just
received or made, in a local SQLite file), as every nio client does; opening the store, which makes
the account and its keys on a first start, runs off the loop.

Cluster: the crypto store is in one home, so E2EE is refused with a cluster at the config check
(``MatrixConfig.cluster_problem``): ``encryption: false`` there, or one instance.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from nio import AsyncClient, Event, KeysUploadError, LocalProtocolError, MegolmEvent

from gateway.errors import AdapterError
from gateway.types import AdapterState

from .config import verified_device
from .sync import source_of

log = logging.getLogger(__name__)

PICKLE_KEY = "pickle.key"
PENDING = "undecrypted"  # the store's list of events kept for their key: {room, event, at, told}
PENDING_MAX = 200
KEEP_SECONDS = 24 * 3600
KEY_WAIT_SECONDS = 30.0

#: (room id, decrypted event JSON) -> True once it was delivered (the adapter's own delivery)
Deliver = Callable[[str, dict], Awaitable[bool]]
#: room id -> the room told once that a message could not be decrypted
Tell = Callable[[str], Awaitable[None]]


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


def pickle_key(directory: Path) -> str:
    """The key the crypto store is pickled under: made once (0600), read at every start."""
    _private_dir(directory)
    path = directory / PICKLE_KEY
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key)
    return key


def _private_files(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, 0o600)


def _load(client: AsyncClient, directory: Path) -> None:
    """nio's store for this user and device (made 0600 before SQLite first writes it), and its Olm account."""
    _private_dir(directory)
    db = directory / f"{client.user_id}_{client.device_id}.db"
    if not db.exists():
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
    client.load_store()
    _private_files(directory)


class Crypto:
    """The bot's device in encrypted rooms (see the module docstring)."""

    def __init__(self, directory: Path, state: AdapterState, *, trust: str = "tofu",
                 verified: tuple[str, ...] = (), key_wait: float = KEY_WAIT_SECONDS):
        self.directory = directory
        self.state = state
        self.trust = trust
        self.verified = {(u, d): k for u, d, k in filter(None, map(verified_device, verified))}
        self.key_wait = key_wait
        self.client: AsyncClient | None = None
        self._pending: dict[str, dict] | None = None  # event id -> kept entry, loaded from the store once
        self._requested: set[str] = set()  # Megolm session ids asked for in this run

    @classmethod
    def from_config(cls, cfg: Any, state: AdapterState) -> "Crypto":
        return cls(state.directory, state, trust=cfg.device_trust, verified=cfg.verified_devices)

    async def client_options(self) -> dict:
        """What ``AsyncClientConfig`` needs for this store (the pickle key read, or made, off the loop)."""
        try:
            from nio.store import SqliteStore
        except ImportError as exc:  # matrix-nio without its e2e extra (vodozemac, peewee)
            raise AdapterError(f"matrix: end-to-end encryption needs matrix-nio's e2e extra ({exc}): install "
                               "switchboard[matrix] again, or set platforms.matrix.encryption: false") from exc
        key = await asyncio.to_thread(pickle_key, self.directory)
        return {"encryption_enabled": True, "store": SqliteStore, "store_sync_tokens": False, "pickle_key": key}

    async def open(self, client: AsyncClient) -> None:
        """The device's store, and its keys on the server: fails the start when the store cannot be opened."""
        if not client.device_id:
            raise AdapterError("matrix: the homeserver did not say which device this access token is, so no "
                               "encryption keys can be kept for it; set platforms.matrix.encryption: false")
        try:
            await asyncio.to_thread(_load, client, self.directory)
        except Exception as exc:
            raise AdapterError(
                f"matrix: the crypto store in {self.directory} could not be opened ({type(exc).__name__}: {exc}); "
                f"if {PICKLE_KEY} was lost, move the .db file away and give the bot a new device (a new token or "
                "password login): peers know the old device's keys") from exc
        self.client = client
        if client.should_upload_keys:
            resp = await client.keys_upload()
            if isinstance(resp, KeysUploadError):
                log.error("matrix: the device's encryption keys were refused (%s): device %s already has keys from "
                          "another crypto store (another client's session, such as Element's, or a store lost or "
                          "left in another home), so encrypted rooms cannot be read; give the bot a device of its "
                          "own (a password login, or a new token)", resp, client.device_id)
        log.info("matrix: end-to-end encryption on, device %s, keys %s (%s)", client.device_id,
                 self.fingerprint(), self.trust)

    def fingerprint(self) -> str:
        olm = self.client.olm if self.client is not None else None
        return olm.account.identity_keys["ed25519"] if olm is not None else ""

    # -- after every /sync

    async def maintain(self, deliver: Deliver, tell: Tell) -> None:
        """Keys uploaded, queried and claimed, to-device messages sent, kept events tried again."""
        client = self.client
        if client is None or client.olm is None:
            return
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if client.should_upload_keys:
            steps.append(("key upload", client.keys_upload))
        if client.should_query_keys:
            steps.append(("key query", client.keys_query))
        if client.should_claim_keys:
            steps.append(("key claim", lambda: client.keys_claim(client.get_users_for_key_claiming())))
        steps.append(("to-device messages", client.send_to_device_messages))
        for what, step in steps:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tried again after the next /sync
                log.warning("matrix: the %s failed (%s: %s); tried again after the next /sync",
                            what, type(exc).__name__, exc)
        await self._retry(deliver, tell)

    # -- reading

    def decrypt(self, room_id: str, event: dict) -> dict | None:
        """An ``m.room.encrypted`` event's plaintext event JSON, or None when this device has no key for it."""
        client = self.client
        parsed = Event.parse_event(event)
        if client is None or client.olm is None or not isinstance(parsed, MegolmEvent):
            return None
        parsed.room_id = room_id
        if client.olm.inbound_group_store.get(room_id, parsed.sender_key, parsed.session_id) is None:
            return None  # no key yet (asked of nio only once it came: it logs every miss as a warning)
        try:
            plain = client.decrypt_event(parsed)
        except Exception:  # noqa: BLE001 - nio's EncryptionError (no session, a bad message): not readable yet
            return None
        source = source_of(plain)
        return source if source.get("type") and source.get("event_id") == event.get("event_id") else None

    async def hold(self, room_id: str, event: dict) -> None:
        """An event this device cannot decrypt: its key asked for, logged, kept to be tried again."""
        pending = await self._load_pending()
        event_id = event.get("event_id")
        if not isinstance(event_id, str) or event_id in pending:
            return
        content = event.get("content") if isinstance(event.get("content"), dict) else {}
        log.warning("matrix: an encrypted message %s from %s in %s cannot be decrypted yet (no key for session %s "
                    "on this device); its key is requested and it is tried again after every /sync",
                    event_id, event.get("sender"), room_id, content.get("session_id"))
        pending[event_id] = {"room": room_id, "event": event, "at": time.time(), "told": False}
        while len(pending) > PENDING_MAX:
            dropped = next(iter(pending))
            log.warning("matrix: too many undecryptable events kept; %s is let go", dropped)
            del pending[dropped]
        await self._save_pending()
        await self._request_key(room_id, event)

    async def _request_key(self, room_id: str, event: dict) -> None:
        parsed = Event.parse_event(event)
        if self.client is None or not isinstance(parsed, MegolmEvent) or parsed.session_id in self._requested:
            return
        parsed.room_id = room_id
        self._requested.add(parsed.session_id)
        try:
            await self.client.request_room_key(parsed)
        except LocalProtocolError:
            pass  # nio already asked for this session
        except Exception as exc:  # noqa: BLE001 - the event stays kept; the room is told if it stays unreadable
            log.warning("matrix: the key request for %s failed: %s: %s", event.get("event_id"), type(exc).__name__, exc)

    async def _retry(self, deliver: Deliver, tell: Tell) -> None:
        pending = await self._load_pending()
        changed = False
        now = time.time()
        for event_id, kept in list(pending.items()):
            room_id, event = kept["room"], kept["event"]
            plain = self.decrypt(room_id, event)
            if plain is not None:
                if await deliver(room_id, plain):
                    log.info("matrix: %s in %s was decrypted once its key came, and delivered", event_id, room_id)
                    del pending[event_id]
                    changed = True
                continue
            if not kept["told"] and now - kept["at"] >= self.key_wait:
                try:
                    await tell(room_id)
                except Exception as exc:  # noqa: BLE001 - told after the next /sync instead
                    log.warning("matrix: could not tell %s about an undecryptable message: %s", room_id, exc)
                    continue
                kept["told"], changed = True, True
            if now - kept["at"] >= KEEP_SECONDS:
                log.warning("matrix: %s from %s in %s never became readable; let go", event_id, event.get("sender"),
                            room_id)
                del pending[event_id]
                changed = True
        if changed:
            await self._save_pending()

    async def _load_pending(self) -> dict[str, dict]:
        if self._pending is None:
            raw = await self.state.get(PENDING)
            try:
                kept = json.loads(raw) if raw else []
            except ValueError:
                kept = []
            self._pending = {k["event"]["event_id"]: k for k in kept if isinstance(k, dict) and "event" in k}
        return self._pending

    async def _save_pending(self) -> None:
        await self.state.set(PENDING, json.dumps(list((self._pending or {}).values())))

    # -- sending

    async def prepare(self, room_id: str) -> bool:
        """Before an event goes into ``room_id``: whether nio may give unverified devices the room key (tofu).

        In an encrypted room the members and their devices are brought up to date first, and with
        ``verified`` every device is verified (listed, its key matching) or blacklisted (anything else)."""
        client = self.client
        room = client.rooms.get(room_id) if client is not None else None
        if client is None or client.olm is None or room is None or not room.encrypted:
            return True
        if not room.members_synced:
            await client.joined_members(room_id)
        if client.should_query_keys:
            await client.keys_query()
        for user_id in list(room.users):
            for device in client.device_store.active_user_devices(user_id):
                if device.id != client.device_id or user_id != client.user_id:
                    self._judge(client, device)
        return self.trust == "tofu"

    def _judge(self, client: AsyncClient, device: Any) -> None:
        """One device's trust under ``device_trust`` (tofu lifts what an earlier verified run blacklisted)."""
        blacklisted = client.olm is not None and client.olm.is_device_blacklisted(device)
        if self.trust == "tofu":
            if blacklisted:
                client.unblacklist_device(device)
            return
        listed = self.verified.get((device.user_id, device.id))
        if listed is not None and listed == device.ed25519:
            if blacklisted:
                client.unblacklist_device(device)
            client.verify_device(device)
        elif not blacklisted:
            client.unverify_device(device)
            client.blacklist_device(device)
            log.info("matrix: %s's device %s is not in platforms.matrix.verified_devices (or its key differs): "
                     "it gets no room keys", device.user_id, device.id)
