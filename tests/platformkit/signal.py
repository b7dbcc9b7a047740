"""Signal for the conformance kit: tests/fakes/signal_cli.py (signal-cli's HTTP daemon: JSON-RPC and its event stream)."""

from __future__ import annotations

from tests.crashkit import BotReply, Plan, Start
from tests.fakes.signal_cli import FakeSignalCli
from tests.waiting import eventually

from .contract import FakePlatform, Sent

_NUMBERS = {"ann": "+4915100000001", "bob": "+4915100000002", "eve": "+4915100000666"}
GROUP_ID = "aGVsbG8gZ3JvdXAgaWQgZm9yIHRlc3RzISE="


class SignalKit(FakePlatform):
    name = "signal"

    def __init__(self) -> None:
        self.sc = FakeSignalCli()

    async def start(self) -> None:
        await self.sc.start()

    async def stop(self) -> None:
        await self.sc.stop()

    def settings(self) -> dict:
        return {"account": self.sc.account, "http_url": self.sc.url}

    def user_id(self, who: str) -> str:
        return _NUMBERS[who]

    async def ready(self, gateway) -> None:
        await super().ready(gateway)
        await eventually(lambda: self.sc.connected > 0, 15, "the event stream open")

    # -- inbound

    def _dm(self, who: str, event: dict) -> Sent:
        return Sent(_NUMBERS[who], f"agent:main:signal:dm:{_NUMBERS[who].replace(':', '%3A')}", event)

    async def dm(self, who: str, text: str) -> Sent:
        return self._dm(who, self.sc.dm(_NUMBERS[who], text, name=who.title()))

    async def group(self, who: str, text: str) -> Sent:
        event = self.sc.in_group(GROUP_ID, _NUMBERS[who], text, mention=True)
        chat = f"group.{GROUP_ID}"
        return Sent(chat, f"agent:main:signal:group:{chat}:{_NUMBERS[who]}", event)

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        item = self.sc.add_attachment(data, content_type=mime, filename=name)
        event = self.sc.envelope(_NUMBERS[who], {"message": text, "attachments": [item]})
        self.sc.emit(event)
        return self._dm(who, event)

    async def redeliver(self, sent: Sent) -> None:
        self.sc.emit(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        first, second = (self.sc.envelope(_NUMBERS[who], {"message": t}) for t in texts)
        self.sc.emit(second)
        self.sc.emit(first)
        return self._dm(who, first), self._dm(who, second)

    async def malformed(self) -> int:
        ann = _NUMBERS["ann"]
        bad = [
            {"jsonrpc": "2.0", "method": "receive"},  # no params
            {"jsonrpc": "2.0", "method": "receive", "params": {"envelope": {"source": ann}}},  # no data message
            self.sc.envelope(ann, {"message": ["not", "a", "string"]}),
            self.sc.envelope(ann, {"message": "a group without an id", "groupInfo": {"type": "DELIVER"}}),
            self.sc.envelope(ann, {"reaction": {"emoji": "👍"}}),  # a reaction without its target
            self.sc.envelope(ann, {"message": "x", "attachments": [{"id": 7}, "nope"],
                                   "mentions": [{"start": 99, "length": -3}]}),
            "not even an object",
        ]
        for event in bad:
            self.sc.emit(event)
        return len(bad)

    # -- what the chats show

    def shown(self, chat: str) -> list[str]:
        return self.sc.texts_in(chat)

    def send_times(self, chat: str) -> list[float]:
        return [c.at for c in self.sc.calls if c.method == "send" and FakeSignalCli.chat_of(c.params) == chat]

    def edits(self, chat: str) -> int:
        return 0

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.sc.fail_next(times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.sc.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        self.sc.restart()  # signal-cli restarted: the stream cut, the event ids it gave forgotten

    def crash_side(self):
        return SignalSide(self.sc)

    def chaos_plan(self, seed: int):
        return Plan(kills=1, rate=8, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)


class SignalSide:
    """The event stream: what signal-cli still keeps (its last 1,000 events) comes again to a client that
    reconnects with an id it does not know, as the adapter's first connection does."""

    name = "signal"
    redelivers = True
    keeps_order = True  # one stream, one event after another

    def __init__(self, sc: FakeSignalCli):
        self.sc = sc
        self._streams = 0

    def settings(self) -> dict:
        return {"platforms": {"signal": {"account": self.sc.account, "http_url": self.sc.url}}}

    def chat_of(self, index: int) -> str:
        return f"+4917{index:08d}"

    async def ready(self, start: Start, timeout: float) -> None:
        self._streams += 1
        await eventually(lambda: len(self.sc.stream_requests) >= self._streams and self.sc.connected > 0, timeout,
                         "the daemon's event stream")

    async def send(self, index: int, text: str) -> bool:
        self.sc.dm(self.chat_of(index), text)
        return True

    def replies(self) -> list[BotReply]:
        return [BotReply(m["chat"], m["message"], m["at"], f"{m['timestamp']}:{self.sc.account}") for m in self.sc.sent]

    def notes(self) -> dict[str, int]:
        return {"event streams opened": len(self.sc.stream_requests)}
