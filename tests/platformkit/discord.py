"""Discord for the conformance kit: tests/fakes/discord.py (REST and the gateway websocket discord.py speaks)."""

from __future__ import annotations

from tests.crashkit import DiscordSide
from tests.fakes.discord import FakeDiscord, visible_text

from .contract import FakePlatform, Sent


class DiscordKit(FakePlatform):
    name = "discord"
    redelivers = False  # Discord sends an event to whoever is connected, never again

    def __init__(self) -> None:
        self.dc = FakeDiscord()
        self._users = {"ann": self.dc.alice, "bob": self.dc.bob, "eve": self.dc.add_user("eve", global_name="Eve")}

    async def start(self) -> None:
        await self.dc.__aenter__()

    async def stop(self) -> None:
        await self.dc.__aexit__(None, None, None)

    def settings(self) -> dict:
        return {"token": self.dc.token, "api_base_url": self.dc.api_base_url, "gateway_url": self.dc.gateway_url}

    def user_id(self, who: str) -> str:
        return str(self._users[who]["id"])

    async def ready(self, gateway) -> None:
        await super().ready(gateway)
        await self.dc.wait_for_connections(1, timeout=15)

    # -- inbound

    def _dm_sent(self, who: str, payload: dict) -> Sent:
        channel = self._users[who]["dm_channel_id"]
        return Sent(channel, f"agent:main:discord:dm:{channel}", payload)

    async def dm(self, who: str, text: str) -> Sent:
        return self._dm_sent(who, await self.dc.dm(self._users[who], text))

    async def group(self, who: str, text: str) -> Sent:
        general = self.dc.general["id"]
        payload = await self.dc.channel_message(self.dc.general, self._users[who], f"{self.dc.mention(self.dc.bot)} {text}",
                                                mentions=(self.dc.bot,))
        return Sent(general, f"agent:main:discord:channel:{general}:{self.user_id(who)}", payload)

    async def thread(self, who: str, text: str) -> Sent:
        thread = self.dc.thread["id"]
        payload = await self.dc.channel_message(self.dc.thread, self._users[who], f"{self.dc.mention(self.dc.bot)} {text}",
                                                mentions=(self.dc.bot,))
        return Sent(thread, f"agent:main:discord:group:{self.dc.general['id']}:{thread}", payload)

    async def edit(self, sent: Sent, text: str) -> None:
        await self.dc.dispatch("MESSAGE_UPDATE", dict(sent.event, content=text, edited_timestamp=sent.event["timestamp"]))

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        payload = await self.dc.dm(self._users[who], text, attachments=(self.dc.attachment(name, data, mime),))
        return self._dm_sent(who, payload)

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, message] = [m for m in self._in(chat) if command[:100] in FakeDiscord.button_ids(m)]
        channel = None if chat == self._users[who]["dm_channel_id"] else self.dc._find_channel(chat)
        await self.dc.press_button(message, self._users[who], command[:100], channel=channel)

    async def redeliver(self, sent: Sent) -> None:
        await self.dc.redeliver(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        user = self._users[who]
        first, second = (self.dc._message(user["dm_channel_id"], user, t) for t in texts)  # ids in written order
        await self.dc.dispatch("MESSAGE_CREATE", second)
        await self.dc.dispatch("MESSAGE_CREATE", first)
        return self._dm_sent(who, first), self._dm_sent(who, second)

    async def malformed(self) -> int:
        ann = self._users["ann"]
        good = self.dc._message(ann["dm_channel_id"], ann, "template")
        bad = [
            {k: v for k, v in good.items() if k != "author"},  # no author
            dict(good, id="not-a-snowflake"),
            dict(good, channel_id="999"),  # a channel nobody knows
            dict(good, content=None),
            dict(good, attachments=[{"id": "1", "filename": "x"}]),  # an attachment without url or size
        ]
        for payload in bad:
            await self.dc.dispatch("MESSAGE_CREATE", payload)
        await self.dc.dispatch("INTERACTION_CREATE", {"id": "1", "type": 3, "application_id": self.dc.application_id,
                                                      "token": "t", "version": 1, "data": {}})
        return len(bad) + 1

    # -- what the chats show

    def _in(self, chat: str) -> list[dict]:
        return [m for m in self.dc.sent() if m["channel_id"] == chat]

    def shown(self, chat: str) -> list[str]:
        return [visible_text(m["content"]).strip() for m in self._in(chat)]

    def buttons(self, chat: str) -> list[str]:
        return [custom_id for m in self._in(chat) for custom_id in FakeDiscord.button_ids(m)]

    def send_times(self, chat: str) -> list[float]:
        return [r.at for r in self.dc.requests if r.path.startswith(f"/channels/{chat}/messages")
                and r.method in ("POST", "PATCH")]

    def edits(self, chat: str) -> int:
        return sum(m.get("edits", 0) for m in self.dc.messages.get(chat, []))

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.dc.fail_next(times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.dc.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        await self.dc.drop_connections()

    def crash_side(self):
        return DiscordSide(self.dc)
