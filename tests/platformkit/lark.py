"""Feishu / Lark for the conformance kit: tests/fakes/lark.py (the open API's token rules and the long
connection's frames, as lark-oapi speaks them).

With ``LARK_KIT_MODE=http`` the same checks run on the HTTP callback mode instead: events pushed to
``/lark/events`` on the gateway's local API, encrypted and signed as the platform does::

    LARK_KIT_MODE=http .venv/bin/python -m pytest tests/test_platform_kit.py -k lark -n 2 -q
"""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp

from adapters.lark.config import EVENTS_PATH
from tests.crashkit import BotReply, Plan, Start
from tests.fakes.lark import FakeLark

from .contract import FakePlatform, Sent

_USERS = {"ann": "ou_ann", "bob": "ou_bob", "eve": "ou_eve"}
GROUP = "oc_group"
ROOT = "om_root1"  # the topic in the group the kit's thread messages are written in


HTTP = os.environ.get("LARK_KIT_MODE", "websocket") == "http"


def _dm(who: str) -> str:
    return f"oc_dm_{who}"


def _mode(fake: FakeLark) -> dict:
    return {"mode": "http", "verification_token": fake.verification_token, "encrypt_key": fake.encrypt_key} \
        if HTTP else {}


class LarkKit(FakePlatform):
    name = "lark"
    serve_api = HTTP  # the callbacks arrive on the local API

    def __init__(self) -> None:
        self.lark = FakeLark()
        self.lark.root_chats[ROOT] = GROUP

    async def start(self) -> None:
        await self.lark.start()

    async def stop(self) -> None:
        await self.lark.stop()

    def settings(self) -> dict:
        return {"app_id": self.lark.app_id, "app_secret": self.lark.app_secret, "base_url": self.lark.base_url,
                **_mode(self.lark)}

    def attach(self, gateway) -> None:
        self.lark.callback_url = f"http://127.0.0.1:{gateway.api.bound_port}{EVENTS_PATH}"

    def user_id(self, who: str) -> str:
        return _USERS[who]

    async def ready(self, gateway) -> None:
        await super().ready(gateway)
        if not HTTP:
            await self.lark.wait_connected(timeout=15)

    async def _send(self, event: dict) -> dict:
        if HTTP:
            status = await self.lark.callback(event, retry=False)
            assert status == 200, f"the gateway answered {status} to the callback of {event['header'].get('event_id')}"
            return event
        frame = await self.lark.send_event(event)
        from tests.waiting import eventually

        await eventually(lambda: self.lark.acknowledged(frame), 15, f"the event in frame {frame} acknowledged")
        return event

    def _dm_sent(self, who: str, event: dict) -> Sent:
        return Sent(_dm(who), f"agent:main:lark:dm:{_dm(who)}", event)

    async def dm(self, who: str, text: str) -> Sent:
        return self._dm_sent(who, await self._send(self.lark.message(_dm(who), _USERS[who], text)))

    async def group(self, who: str, text: str) -> Sent:
        event = await self._send(self.lark.message(GROUP, _USERS[who], text, chat_type="group", mention=True))
        return Sent(GROUP, f"agent:main:lark:group:{GROUP}:{_USERS[who]}", event)

    async def thread(self, who: str, text: str) -> Sent:
        event = await self._send(self.lark.message(GROUP, _USERS[who], text, chat_type="group", mention=True,
                                                   root_id=ROOT))
        return Sent(f"{GROUP}/{ROOT}", f"agent:main:lark:group:{GROUP}:{ROOT}", event)

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        # Feishu sends a file as its own message (no caption): the text follows as a message of its own
        self.lark.add_file("file_v2_1", data)
        file_event = await self._send(self.lark.message(_dm(who), _USERS[who], "", message_type="file",
                                                        content={"file_key": "file_v2_1", "file_name": name}))
        return self._dm_sent(who, file_event)

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, card] = [s for s in self.lark.shown(chat) if command in s.commands]
        await self._send(self.lark.press_event(card.id, _USERS[who], command))

    async def redeliver(self, sent: Sent) -> None:
        await self._send(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        first, second = (self.lark.message(_dm(who), _USERS[who], t) for t in texts)
        await self._send(second)
        await self._send(first)
        return self._dm_sent(who, first), self._dm_sent(who, second)

    async def malformed(self) -> int:
        good = self.lark.message(_dm("ann"), _USERS["ann"], "x")
        bad = [
            {"schema": "2.0", "header": {"event_type": "im.message.receive_v1"}},  # no event at all
            dict(good, event={"message": {"chat_id": 5, "message_id": ["x"]}, "sender": "nobody"}),
            dict(good, event=dict(good["event"], message=dict(good["event"]["message"], content="{not json"))),
            dict(good, header=dict(good["header"], event_type="card.action.trigger"), event={"action": "nope"}),
        ]
        for event in bad:
            await self._send(event)
        if HTTP:  # garbage, and a forged event (not encrypted, not signed): refused, reaching nothing
            garbage = b"\xff\xfe not json"
            assert (await self.lark.post_callback(garbage, self.lark.signed_headers(garbage)))[0] == 400
            forged = self.lark.callback_body(self.lark.message(_dm("ann"), _USERS["ann"], "forged"), encrypted=False)
            assert (await self.lark.post_callback(forged, {"Content-Type": "application/json"}))[0] == 401
            return len(bad) + 2
        await self.lark.send_raw(b"\xff\xfe not json")
        return len(bad) + 1

    def shown(self, chat: str) -> list[str]:
        return [s.text for s in self.lark.shown(chat)]

    def buttons(self, chat: str) -> list[str]:
        return [c for s in self.lark.shown(chat) for c in s.commands]

    def send_times(self, chat: str) -> list[float]:
        return self.lark.times(chat)

    def edits(self, chat: str) -> int:
        return sum(s.edits for s in self.lark.shown(chat))

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.lark.fail_next(times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.lark.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        if HTTP:  # no connection of the bot's: the platform's connections to it close
            await self.lark.drop_callback_connections()
            return
        before = self.lark.connections
        await self.lark.drop_connection()
        await self.lark.wait_connected(before + 1, timeout=15)

    def crash_side(self):
        return LarkSide(self.lark)

    def chaos_plan(self, seed: int):
        return Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)


class LarkSide:
    """The long connection: an event not acknowledged is pushed again on the next connection.  (HTTP:
    a callback not answered 200 is pushed again, every 0.25 s for a minute, outlasting a restart.)"""

    name = "lark"
    redelivers = True
    keeps_order = False  # an event pushed again after the restart can come after a newer one of its chat

    def __init__(self, fake: FakeLark):
        self.fake = fake
        self._connections = 0
        self.port = _free_port()
        if HTTP:
            self.fake.callback_url = f"http://127.0.0.1:{self.port}{EVENTS_PATH}"
            self.fake.callback_retry, self.fake.callback_attempts = 0.25, 240

    def settings(self) -> dict:
        return {"api": {"port": self.port},
                "platforms": {"lark": {"app_id": self.fake.app_id, "app_secret": self.fake.app_secret,
                                       "base_url": self.fake.base_url, **_mode(self.fake)}}}

    def chat_of(self, index: int) -> str:
        return f"oc_dm_user{index}"

    async def ready(self, start: Start, timeout: float) -> None:
        if HTTP:
            await _connected(f"http://127.0.0.1:{self.port}/healthz", timeout)
            return
        self._connections += 1
        await self.fake.wait_connected(self._connections, timeout)

    async def send(self, index: int, text: str) -> bool:
        event = self.fake.message(self.chat_of(index), f"ou_user{index}", text)
        if HTTP:
            self.fake.deliver_callback(event)
        else:
            await self.fake.send_event(event)
        return True

    def replies(self) -> list[BotReply]:
        return [BotReply(chat, s.text, s.at, s.id) for chat, shown in self.fake.chats.items() for s in shown]

    def notes(self) -> dict[str, int]:
        if HTTP:
            return {"callbacks pushed again": len(self.fake.callbacks) - len({e for e, _ in self.fake.callbacks}),
                    "callbacks never answered 200": len(self.fake.unanswered_callbacks())}
        return {"events pushed again": len(self.fake.pushed) - len(set(self.fake.pushed)),
                "events never acknowledged": len(self.fake.unacknowledged())}


def _free_port() -> int:
    import socket

    with socket.socket() as s:  # the restarted daemon's local API binds it again
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _connected(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if (await resp.json())["platforms"]["lark"]["state"] == "connected":
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "the daemon's lark platform never connected"
            await asyncio.sleep(0.1)
