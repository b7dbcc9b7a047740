"""WhatsApp for the conformance kit: tests/fakes/whatsapp.py (the Cloud API's Graph API and its signed webhooks)."""

from __future__ import annotations

import socket

from tests.crashkit import BotReply, Plan, Start
from tests.fakes.whatsapp import FakeWhatsApp
from tests.waiting import eventually

from .contract import FakePlatform, Sent

_IDS = {"ann": "4915100000001", "bob": "4915100000002", "eve": "4915100000666"}


def free_port() -> int:
    """A port free now, for a daemon run as a process (it must be the same across its restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_for(wa: FakeWhatsApp) -> dict:
    return {"access_token": wa.token, "phone_number_id": wa.phone_number_id, "app_secret": wa.app_secret,
            "verify_token": wa.verify_token, "api_base_url": wa.base_url}


class WhatsAppKit(FakePlatform):
    name = "whatsapp"
    serve_api = True  # Meta's webhook lands on the local API (/whatsapp/webhook)

    def __init__(self) -> None:
        self.wa = FakeWhatsApp()

    async def start(self) -> None:
        await self.wa.start()

    async def stop(self) -> None:
        await self.wa.stop()

    def settings(self) -> dict:
        return settings_for(self.wa)

    def user_id(self, who: str) -> str:
        return _IDS[who]

    def attach(self, gateway) -> None:
        self.wa.webhook_url = f"http://127.0.0.1:{gateway.api.bound_port}/whatsapp/webhook"

    # -- inbound

    def _sent(self, who: str, payload: dict) -> Sent:
        return Sent(_IDS[who], f"agent:main:whatsapp:dm:{_IDS[who]}", payload)

    async def dm(self, who: str, text: str) -> Sent:
        return self._sent(who, self.wa.text(_IDS[who], text, name=who.title()))

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        media_id = self.wa.add_media(data, mime)
        payload = self.wa.message(_IDS[who], "document", {"id": media_id, "mime_type": mime, "filename": name,
                                                          "caption": text, "sha256": "x"})
        return self._sent(who, self.wa.push(payload))

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, message] = [m for m in self.wa.to(chat) if command in FakeWhatsApp.button_ids(m)]
        title = next(b["reply"]["title"] for b in message["interactive"]["action"]["buttons"]
                     if b["reply"]["id"] == command)
        self.wa.push(self.wa.message(_IDS[who], "interactive",
                                     {"type": "button_reply", "button_reply": {"id": command, "title": title}},
                                     reply_to=message["id"]))

    async def redeliver(self, sent: Sent) -> None:
        self.wa.push(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        first, second = (self.wa.message(_IDS[who], "text", {"body": t}) for t in texts)
        self.wa.push(second)
        self.wa.push(first)
        return self._sent(who, first), self._sent(who, second)

    async def malformed(self) -> int:
        ann = _IDS["ann"]
        bad = [
            {"object": "whatsapp_business_account"},  # no entry
            {"object": "whatsapp_business_account", "entry": [{"changes": [{"field": "messages", "value": {
                "metadata": {"phone_number_id": self.wa.phone_number_id},
                "messages": [{"id": "wamid.BAD1", "type": "text"}]}}]}]},  # no sender, no body
            self.wa.message(ann, "text", {"body": ["not", "a", "string"]}),
            self.wa.message("not-a-number", "text", {"body": "who am I"}),
            self.wa.message(ann, "image", {"mime_type": "image/jpeg"}),  # an image without a media id
            self.wa._envelope({"statuses": [{"id": 5, "status": "exploded"}]}),
            [1, 2, 3],
        ]
        for payload in bad:
            self.wa.push(payload)  # type: ignore[arg-type]
        forged = await self.wa.post(b'{"object": "whatsapp_business_account"}',
                                    {"X-Hub-Signature-256": "sha256=" + "0" * 64})
        unsigned = await self.wa.post(b"{}", {})
        assert forged == 401 and unsigned == 401, (forged, unsigned)
        return len(bad) + 2

    # -- what the chats show

    def shown(self, chat: str) -> list[str]:
        return self.wa.texts_to(chat)

    def buttons(self, chat: str) -> list[str]:
        return [i for m in self.wa.to(chat) for i in FakeWhatsApp.button_ids(m)]

    def send_times(self, chat: str) -> list[float]:
        return [c.at for c in self.wa.calls if c.path.endswith("/messages") and c.body.get("to") == chat
                and c.body.get("type") != "reaction"]

    def edits(self, chat: str) -> int:
        return 0

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.wa.fail_next(times, status=status)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.wa.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        self.wa.drop_next_delivery()  # no connection to drop: the next webhook POST is cut instead

    def crash_side(self):
        return WhatsAppSide(self.wa)

    def chaos_plan(self, seed: int):
        return Plan(kills=1, rate=8, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)


class WhatsAppSide:
    """Webhooks: Meta retries a POST until it is answered 200, so what the killed daemon had not stored
    comes again once it listens."""

    name = "whatsapp"
    redelivers = True
    keeps_order = True  # the fake delivers one POST at a time, the next only after a 200

    def __init__(self, wa: FakeWhatsApp):
        self.wa = wa
        self.port = free_port()
        self.wa.webhook_url = f"http://127.0.0.1:{self.port}/whatsapp/webhook"

    def settings(self) -> dict:
        return {"api": {"port": self.port}, "platforms": {"whatsapp": settings_for(self.wa)}}

    def chat_of(self, index: int) -> str:
        return f"4917000{index:05d}"

    async def ready(self, start: Start, timeout: float) -> None:
        await eventually(lambda: any(c.method == "GET" and c.at >= start.spawned for c in self.wa.calls), timeout,
                         "the daemon's token check")

    async def send(self, index: int, text: str) -> bool:
        self.wa.text(self.chat_of(index), text)
        return True

    def replies(self) -> list[BotReply]:
        return [BotReply(m["to"], FakeWhatsApp.visible(m), m["at"], m["id"]) for m in self.wa.sent
                if m.get("type") != "reaction"]

    def notes(self) -> dict[str, int]:
        return {"webhooks delivered again": sum(1 for d in self.wa.deliveries if d.status != 200)}


class WhatsAppClusterSide(WhatsAppSide):
    """The webhook of a cluster: each instance listens on its own local API, Meta's POSTs go to one after
    another, and each message answered 200 is POSTed once more to the next instance (a retry landing
    elsewhere), so every instance takes messages and stores each one once."""

    def __init__(self, wa: FakeWhatsApp):
        super().__init__(wa)
        wa.webhook_urls = []
        wa.again_elsewhere = True

    def settings(self) -> dict:  # asked once per instance
        port = free_port()
        self.wa.webhook_urls.append(f"http://127.0.0.1:{port}/whatsapp/webhook")
        return {"api": {"port": port}, "platforms": {"whatsapp": settings_for(self.wa)}}

    def notes(self) -> dict[str, int]:
        return {**super().notes(), "instances": len(self.wa.webhook_urls)}

