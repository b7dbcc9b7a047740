"""Matrix for the conformance kit: tests/fakes/matrix.py (the client-server API matrix-nio speaks)."""

from __future__ import annotations

import re
import time

from gateway.keys import _part
from tests.crashkit import BotReply, Plan, Start
from tests.fakes.matrix import BOT, SERVER, FakeMatrix
from tests.waiting import eventually

from .contract import FakePlatform, Sent

_USERS = {who: f"@{who}:{SERVER}" for who in ("ann", "bob", "eve")}
GROUP = f"!team:{SERVER}"
ROOT = "$thread-root"  # the event a thread in the group hangs from
_COMMAND = re.compile(r"/(?:approve|deny) \S+")


def _dm_key(room: str) -> str:
    return f"agent:main:matrix:dm:{_part(room)}"


class MatrixKit(FakePlatform):
    name = "matrix"

    def __init__(self) -> None:
        self.hs = FakeMatrix()
        self.hs.room(GROUP, list(_USERS.values()))

    async def start(self) -> None:
        await self.hs.start()

    async def stop(self) -> None:
        await self.hs.stop()

    def settings(self) -> dict:
        return {"homeserver": self.hs.base_url, "access_token": self.hs.token, "sync_timeout_seconds": 5}

    def user_id(self, who: str) -> str:
        return _USERS[who]

    # -- inbound

    def _dm(self, who: str, event: dict) -> Sent:
        return Sent(event["room_id"], _dm_key(event["room_id"]), event)

    async def dm(self, who: str, text: str) -> Sent:
        room = self.hs.dm_room(_USERS[who])
        return self._dm(who, self.hs.message(room, _USERS[who], text))

    async def group(self, who: str, text: str) -> Sent:
        event = self.hs.message(GROUP, _USERS[who], f"{BOT} {text}", **{"m.mentions": {"user_ids": [BOT]}})
        return Sent(GROUP, f"agent:main:matrix:group:{_part(GROUP)}:{_part(_USERS[who])}", event)

    async def thread(self, who: str, text: str) -> Sent:
        event = self.hs.message(GROUP, _USERS[who], f"{BOT} {text}", **{
            "m.mentions": {"user_ids": [BOT]},
            "m.relates_to": {"rel_type": "m.thread", "event_id": ROOT, "is_falling_back": True,
                             "m.in_reply_to": {"event_id": ROOT}}})
        return Sent(f"{GROUP}/{ROOT}", f"agent:main:matrix:group:{_part(GROUP)}:{_part(ROOT)}", event)

    async def edit(self, sent: Sent, text: str) -> None:
        event = sent.event
        self.hs.event(event["room_id"], event["sender"], "m.room.message", {
            "msgtype": "m.text", "body": f"* {text}", "m.new_content": {"msgtype": "m.text", "body": text},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event["event_id"]}})

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        room = self.hs.dm_room(_USERS[who])
        uri = self.hs.add_media(data, mime)
        event = self.hs.event(room, _USERS[who], "m.room.message", {
            "msgtype": "m.file", "body": text, "filename": name, "url": uri,
            "info": {"mimetype": mime, "size": len(data)}})
        return self._dm(who, event)

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, message] = [m for m in self._in(chat) if command in self._commands(m)]
        key = "❌" if command.startswith("/deny") else "✅"
        self.hs.event(message.room_id, _USERS[who], "m.reaction",
                      {"m.relates_to": {"rel_type": "m.annotation", "event_id": message.event_id, "key": key}})

    async def redeliver(self, sent: Sent) -> None:
        self.hs.redeliver(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        room = self.hs.dm_room(_USERS[who])
        first, second = ({"type": "m.room.message", "sender": _USERS[who], "event_id": self.hs.new_event_id(),
                          "room_id": room, "origin_server_ts": int(time.time() * 1000),
                          "content": {"msgtype": "m.text", "body": t}} for t in texts)
        self.hs.push(room, second)
        self.hs.push(room, first)
        return self._dm(who, first), self._dm(who, second)

    async def malformed(self) -> int:
        room, ann = self.hs.dm_room(_USERS["ann"]), _USERS["ann"]
        bad = [
            {"type": "m.room.message", "sender": ann, "room_id": room, "content": {"msgtype": "m.text", "body": "x"}},
            {"type": "m.room.message", "sender": ann, "room_id": room, "event_id": self.hs.new_event_id(),
             "content": "not an object"},
            {"type": "m.room.message", "sender": ann, "room_id": room, "event_id": self.hs.new_event_id(),
             "content": {"msgtype": 7, "body": ["a", "list"]}},
            {"type": "m.room.message", "sender": ann, "room_id": room, "event_id": self.hs.new_event_id(),
             "content": {"msgtype": "m.image", "body": "pic.png", "url": "https://elsewhere.example/pic.png"}},
            {"type": "m.reaction", "sender": ann, "room_id": room, "event_id": self.hs.new_event_id(),
             "content": {"m.relates_to": "nowhere"}},
            {"type": "m.room.message", "sender": ann, "room_id": room, "event_id": self.hs.new_event_id(),
             "content": {"msgtype": "m.text", "body": "an edit of nothing",
                         "m.relates_to": {"rel_type": "m.replace", "event_id": 12}}},
        ]
        for event in bad:
            self.hs.push(room, event)
        return len(bad)

    # -- what the rooms show

    @staticmethod
    def _split(chat: str) -> tuple[str, str | None]:
        room, _, thread = chat.partition("/")
        return room, thread or None

    def _in(self, chat: str):
        return self.hs.bot_messages(*self._split(chat))

    def _commands(self, message) -> list[str]:
        # the request says how to answer it (reactions stand in for buttons; the bot's own ✅ and ❌
        # under it, put there right after it, are the hint to tap)
        body = str(self.hs.current(message).get("body", ""))
        return _COMMAND.findall(body) if "React ✅ to approve" in body else []

    def shown(self, chat: str) -> list[str]:
        return self.hs.shown(*self._split(chat))

    def buttons(self, chat: str) -> list[str]:
        return [c for m in self._in(chat) for c in self._commands(m)]

    def send_times(self, chat: str) -> list[float]:
        room, thread = self._split(chat)
        ours = {m.event_id for m in self._in(chat)}
        out = []
        for at, room_id, type_, content in self.hs.attempts:  # refused ones too
            rel = content.get("m.relates_to") or {}
            if room_id != room or type_ != "m.room.message":
                continue
            if rel.get("rel_type") == "m.replace":
                if rel.get("event_id") in ours:
                    out.append(at)
            elif (rel.get("event_id") if rel.get("rel_type") == "m.thread" else None) == thread:
                out.append(at)
        return out

    def edits(self, chat: str) -> int:
        return sum(len(self.hs.edits_of(m.event_id)) for m in self._in(chat))

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.hs.fail_next("send", times, status=status, retry_after_ms=int(retry_after * 1000))

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.hs.delay_next("send", seconds, times)

    async def drop_connection(self) -> None:
        self.hs.drop_next_sync()

    def crash_side(self):
        return MatrixSide(self.hs)

    def chaos_plan(self, seed: int):
        return Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)


class MatrixSide:
    """/sync from a stored next_batch: what the killed daemon had not stored comes again after the restart."""

    name = "matrix"
    redelivers = True
    keeps_order = True  # one /sync's timeline is handed over event by event, in order

    def __init__(self, hs: FakeMatrix, *, encryption: bool = True):
        self.hs = hs
        self.encryption = encryption  # a cluster cannot share the crypto store: off there (MatrixConfig)
        self._syncs_seen = 0

    def settings(self) -> dict:
        return {"platforms": {"matrix": {"homeserver": self.hs.base_url, "access_token": self.hs.token,
                                         "sync_timeout_seconds": 5, "encryption": self.encryption}}}

    def chat_of(self, index: int) -> str:
        return self.hs.dm_room(f"@user{index}:{SERVER}")

    async def ready(self, start: Start, timeout: float) -> None:
        await eventually(lambda: any(c.path.endswith("/sync") and c.at >= start.spawned and c.status == 200
                                     for c in self.hs.calls), timeout, "the daemon's first /sync")

    async def send(self, index: int, text: str) -> bool:
        self.hs.message(self.chat_of(index), f"@user{index}:{SERVER}", text)
        return True

    def replies(self) -> list[BotReply]:
        # each message as it shows now: a streamed reply's first post is only its beginning, edited later
        return [BotReply(s.room_id, str(self.hs.current(s).get("body", "")), s.at, s.event_id) for s in self.hs.sent
                if s.type == "m.room.message" and (s.content.get("m.relates_to") or {}).get("rel_type") != "m.replace"]

    def notes(self) -> dict[str, int]:
        return {"/sync calls": self.hs.syncs}
