"""Slack for the conformance kit: tests/fakes/slack.py (the Web API and Socket Mode slack-bolt speaks)."""

from __future__ import annotations

import itertools

from tests.crashkit import Plan, SlackSide
from tests.fakes.slack import FakeSlack, visible_text

from .contract import FakePlatform, Sent

_USERS = {"ann": ("U1", "D1"), "bob": ("U2", "D2"), "eve": ("U9", "D9")}
CHANNEL = "C1"
THREAD = "1699999999.000001"  # a thread in #general the kit's thread messages are written in


class SlackKit(FakePlatform):
    name = "slack"

    def __init__(self) -> None:
        self.slack = FakeSlack()
        self.slack.users["U9"] = "eve"
        self._files = itertools.count(1)

    async def start(self) -> None:
        await self.slack.start()

    async def stop(self) -> None:
        await self.slack.stop()

    def settings(self) -> dict:
        return {"bot_token": self.slack.bot_token, "app_token": self.slack.app_token,
                "api_base_url": self.slack.base_url, "mode": "socket"}

    def user_id(self, who: str) -> str:
        return _USERS[who][0]

    async def ready(self, gateway) -> None:
        await super().ready(gateway)
        await self.slack.wait_connected(timeout=15)

    # -- inbound

    async def _send(self, event: dict) -> dict:
        await self.slack.send_event(event)
        return event

    def _dm_sent(self, who: str, event: dict) -> Sent:
        return Sent(_USERS[who][1], f"agent:main:slack:dm:{_USERS[who][1]}", event)

    async def dm(self, who: str, text: str) -> Sent:
        user, channel = _USERS[who]
        return self._dm_sent(who, await self._send(self.slack.message(channel, user, text)))

    async def group(self, who: str, text: str) -> Sent:
        # a top-level mention is answered in its own thread: a session of its own
        event = await self._send(self.slack.message(CHANNEL, _USERS[who][0], f"<@{self.slack.bot_user_id}> {text}"))
        return Sent(f"{CHANNEL}/{event['ts']}", f"agent:main:slack:group:{CHANNEL}:{event['ts']}", event)

    async def thread(self, who: str, text: str) -> Sent:
        event = await self._send(self.slack.message(CHANNEL, _USERS[who][0], f"<@{self.slack.bot_user_id}> {text}",
                                                    thread_ts=THREAD))
        return Sent(f"{CHANNEL}/{THREAD}", f"agent:main:slack:group:{CHANNEL}:{THREAD}", event)

    async def edit(self, sent: Sent, text: str) -> None:
        event = sent.event
        await self.slack.send_event({"type": "message", "subtype": "message_changed", "channel": event["channel"],
                                     "channel_type": event["channel_type"], "ts": self.slack.new_ts(),
                                     "message": dict(event, text=text, edited={"user": event["user"]}),
                                     "previous_message": event})

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        user, channel = _USERS[who]
        shared = self.slack.add_file(f"F{next(self._files)}", data, name=name, mimetype=mime)
        return self._dm_sent(who, await self._send(self.slack.message(channel, user, text, files=[shared])))

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, message] = [m for m in self._in(chat) if command[:2000] in FakeSlack.button_values(m)]
        await self.slack.press(message, _USERS[who][0], command[:2000])

    async def redeliver(self, sent: Sent) -> None:
        await self.slack.send_event(sent.event, retry_attempt=1)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        user, channel = _USERS[who]
        first, second = (self.slack.message(channel, user, t) for t in texts)  # ts in written order
        await self._send(second)
        await self._send(first)
        return self._dm_sent(who, first), self._dm_sent(who, second)

    async def malformed(self) -> int:
        user, channel = _USERS["ann"]
        bad_events = [
            {"type": "message"},  # no channel, no ts, no user
            {"type": "message", "channel": channel, "user": user, "ts": 12, "text": ["not", "a", "string"]},
            {"type": "app_mention", "channel": None, "user": user, "ts": self.slack.new_ts(), "text": "x"},
            {"type": "message", "channel": channel, "user": user, "ts": self.slack.new_ts(), "files": "nope",
             "subtype": "file_share", "text": "a file list that is not a list"},
        ]
        for event in bad_events:
            await self.slack.send_event(event)
        await self.slack.push({"envelope_id": "bad-envelope", "type": "events_api", "payload": {}})
        return len(bad_events) + 1

    # -- what the chats show

    @staticmethod
    def _split(chat: str) -> tuple[str, str | None]:
        channel, _, thread = chat.partition("/")
        return channel, thread or None

    def _in(self, chat: str) -> list[dict]:
        channel, thread = self._split(chat)
        return [body for body in self.slack.posted.values()
                if body.get("channel") == channel and (thread is None or body.get("thread_ts") == thread)]

    def shown(self, chat: str) -> list[str]:
        return [visible_text(str(body.get("text") or "")) for body in self._in(chat)]

    def buttons(self, chat: str) -> list[str]:
        return [value for body in self._in(chat) for value in FakeSlack.button_values(body)]

    def send_times(self, chat: str) -> list[float]:
        channel, thread = self._split(chat)
        return [c.at for c in self.slack.calls if c.method in ("chat.postMessage", "chat.update")
                and c.body.get("channel") == channel
                and (thread is None or c.method == "chat.update" or c.body.get("thread_ts") == thread)]

    def edits(self, chat: str) -> int:
        channel, _ = self._split(chat)
        return sum(1 for u in self.slack.updates if u.get("channel") == channel)

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.slack.fail_next("chat.postMessage", times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.slack.delay_next("chat.postMessage", seconds, times)

    async def drop_connection(self) -> None:
        await self.slack.drop_connection()

    def crash_side(self):
        return SlackSide(self.slack)

    def chaos_plan(self, seed: int):
        # replies go out at Slack's pace (about one a second), so messages always wait for an answer; the
        # daemon is frozen at the kill moment and killed once one more envelope reached it, unacknowledged
        return Plan(kills=1, rate=6, chats=4, retire=4, load_seconds=(0.8, 2.0), kill_on_send=True, seed=seed)
