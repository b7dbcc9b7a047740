"""Telegram for the conformance kit: tests/fakes/telegram.py (the Bot API python-telegram-bot long-polls)."""

from __future__ import annotations

import itertools

from tests.crashkit import TelegramSide
from tests.fakes.telegram import FakeTelegram, SentMessage

from .contract import FakePlatform, Sent

_IDS = {"ann": 111, "bob": 222, "eve": 666}
GROUP = -1001234567890
TOPIC = 77


class TelegramKit(FakePlatform):
    name = "telegram"

    def __init__(self) -> None:
        self.tg = FakeTelegram()
        self._users = {who: FakeTelegram.user(uid, who.title()) for who, uid in _IDS.items()}
        self._group = FakeTelegram.group_chat(GROUP, "Team", forum=True)
        self._files = itertools.count(1)

    async def start(self) -> None:
        await self.tg.start()

    async def stop(self) -> None:
        await self.tg.stop()

    def settings(self) -> dict:
        return {"token": self.tg.token, "base_url": self.tg.base_url, "base_file_url": self.tg.base_file_url,
                "poll_timeout": 5}

    def user_id(self, who: str) -> str:
        return str(_IDS[who])

    # -- inbound

    def _dm_sent(self, who: str, update: dict) -> Sent:
        return Sent(str(_IDS[who]), f"agent:main:telegram:dm:{_IDS[who]}", update)

    async def dm(self, who: str, text: str) -> Sent:
        return self._dm_sent(who, self.tg.dm(self._users[who], text))

    async def group(self, who: str, text: str) -> Sent:
        update = self.tg.in_group(self._group, self._users[who], f"@{self.tg.bot_user['username']} {text}")
        return Sent(str(GROUP), f"agent:main:telegram:group:{GROUP}:{_IDS[who]}", update)

    async def thread(self, who: str, text: str) -> Sent:
        update = self.tg.in_topic(self._group, self._users[who], f"@{self.tg.bot_user['username']} {text}",
                                  thread_id=TOPIC)
        return Sent(f"{GROUP}/{TOPIC}", f"agent:main:telegram:group:{GROUP}:{TOPIC}", update)

    async def edit(self, sent: Sent, text: str) -> None:
        message = dict(sent.event["message"], text=text, edit_date=sent.event["message"]["date"] + 1)
        self.tg.push(message, kind="edited_message")

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        document = self.tg.document(f"doc{next(self._files)}", data, name, mime)
        update = self.tg.push(self.tg.message(FakeTelegram.private_chat(self._users[who]), self._users[who],
                                              caption=text, document=document))
        return self._dm_sent(who, update)

    async def press(self, who: str, chat: str, command: str) -> None:
        sent = [m for m in self._in(chat) if command in m.button_data()][-1]
        where = self._group if chat.startswith(str(GROUP)) else FakeTelegram.private_chat(self._users[who])
        self.tg.press(sent, self._users[who], command, chat=where)

    async def redeliver(self, sent: Sent) -> None:
        self.tg.redeliver(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        chat, user = FakeTelegram.private_chat(self._users[who]), self._users[who]
        first, second = (self.tg.message(chat, user, t) for t in texts)  # message ids in the order written
        later = self.tg.push(second)
        earlier = self.tg.push(first)
        return self._dm_sent(who, earlier), self._dm_sent(who, later)

    async def malformed(self) -> int:
        chat = FakeTelegram.private_chat(self._users["ann"])
        bad = [
            {"message_id": 1, "date": 0, "chat": chat},  # no sender, no text
            {"message_id": 2, "date": 0, "chat": {"id": 5, "type": "martian"}, "from": self._users["ann"],
             "text": "an unknown chat type"},
            {"message_id": 3, "date": 0, "chat": chat, "from": self._users["ann"], "text": "",
             "entities": [{"type": "bot_command", "offset": 40, "length": 9}]},  # an entity past the end
            {"message_id": 4, "date": 0, "chat": chat, "from": self._users["ann"], "sticker": {"file_id": 7}},
        ]
        for message in bad:
            self.tg.push(message)
        self.tg.push({"id": "q1", "from": self._users["ann"], "chat_instance": "x"}, kind="callback_query")
        return len(bad) + 1

    # -- what the chats show

    def _in(self, chat: str) -> list[SentMessage]:
        chat_id, _, thread = chat.partition("/")
        return [m for m in self.tg.sent if str(m.chat_id) == chat_id and str(m.thread_id or "") == thread]

    def shown(self, chat: str) -> list[str]:
        return [m.visible_text for m in self._in(chat)]

    def buttons(self, chat: str) -> list[str]:
        return [data for m in self._in(chat) for data in m.button_data()]

    def send_times(self, chat: str) -> list[float]:
        chat_id, _, thread = chat.partition("/")
        return [r.at for r in self.tg.requests if r.method.lower() in ("sendmessage", "editmessagetext")
                and str(r.params.get("chat_id")) == chat_id and str(r.params.get("message_thread_id") or "") == thread]

    def edits(self, chat: str) -> int:
        return sum(m.edits for m in self._in(chat))

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        if status == 429:
            self.tg.rate_limit_next("sendMessage", times, retry_after=max(1, round(retry_after)))
        else:
            self.tg.fail_next("sendMessage", times, status=status, description="Internal Server Error")

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.tg.delay_next("sendMessage", seconds, times)

    async def drop_connection(self) -> None:
        self.tg.drop_next("getUpdates")

    def crash_side(self):
        return TelegramSide(self.tg)
