"""Microsoft Teams for the conformance kit: tests/fakes/teams.py (the Bot Framework's login side and
connector; activities signed with a test key its own OpenID metadata publishes), posting to the
messaging endpoint on the gateway's local API (``/teams/messages``)."""

from __future__ import annotations

import socket

from adapters.teams.config import MESSAGES_PATH
from tests.crashkit import BotReply, Plan, Start
from tests.fakes.teams import FakeTeams
from tests.waiting import eventually

from .contract import FakePlatform, Sent

_USERS = {"ann": "29:ann", "bob": "29:bob", "eve": "29:eve"}
GROUP = "19:group-chat@thread.v2"
CHANNEL = "19:general@thread.tacv2"
THREAD = "1700000000001"  # the root post of the channel thread the kit's thread messages are written in


def _part(value: str) -> str:
    return value.replace("%", "%25").replace(":", "%3A")


def _dm(who: str) -> str:
    return f"a:dm-{who}"


def _free_port() -> int:
    with socket.socket() as s:  # the daemon of the kill test binds it again after each restart
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TeamsKit(FakePlatform):
    name = "teams"
    serve_api = True  # the messaging endpoint lives on the local API

    def __init__(self) -> None:
        self.teams = FakeTeams()

    async def start(self) -> None:
        await self.teams.start()

    async def stop(self) -> None:
        await self.teams.stop()

    def settings(self) -> dict:
        return {"app_id": self.teams.app_id, "app_password": self.teams.app_password,
                "openid_metadata_url": self.teams.metadata_url, "token_url": self.teams.token_url,
                "service_url": self.teams.service_url}

    def user_id(self, who: str) -> str:
        return _USERS[who]

    def attach(self, gateway) -> None:
        self.teams.endpoint = f"http://127.0.0.1:{gateway.api.bound_port}{MESSAGES_PATH}"

    # -- inbound

    async def _post(self, activity: dict) -> dict:
        status = await self.teams.post(activity)
        assert status == 200, f"the bot answered {status} to activity {activity.get('id')}"
        return activity

    async def dm(self, who: str, text: str) -> Sent:
        activity = await self._post(self.teams.activity(conversation=_dm(who), user=_USERS[who], text=text, name=who))
        return Sent(_dm(who), f"agent:main:teams:dm:{_part(_dm(who))}", activity)

    async def group(self, who: str, text: str) -> Sent:
        activity = await self._post(self.teams.activity(conversation=GROUP, user=_USERS[who], text=text, name=who,
                                                        kind="groupChat", mention=True))
        return Sent(GROUP, f"agent:main:teams:group:{_part(GROUP)}:{_part(_USERS[who])}", activity)

    async def thread(self, who: str, text: str) -> Sent:
        conversation = f"{CHANNEL};messageid={THREAD}"
        activity = await self._post(self.teams.activity(conversation=conversation, user=_USERS[who], text=text,
                                                        name=who, kind="channel", mention=True))
        return Sent(conversation, f"agent:main:teams:group:{_part(CHANNEL)}:{THREAD}", activity)

    async def edit(self, sent: Sent, text: str) -> None:
        await self._post(dict(sent.event, type="messageUpdate", text=text))

    async def attachment(self, who: str, text: str, name: str, data: bytes, mime: str) -> Sent:
        url = self.teams.add_file(name, data)
        extra = {"attachments": [{"contentType": "application/vnd.microsoft.teams.file.download.info", "name": name,
                                  "content": {"downloadUrl": url, "fileType": name.rsplit(".", 1)[-1],
                                              "uniqueId": name}}]}
        activity = await self._post(self.teams.activity(conversation=_dm(who), user=_USERS[who], text=text, name=who,
                                                        **extra))
        return Sent(_dm(who), f"agent:main:teams:dm:{_part(_dm(who))}", activity)

    async def press(self, who: str, chat: str, command: str) -> None:
        [*_, card] = [s for s in self.teams.shown(chat) if command in s.commands]
        kind = "channel" if ";messageid=" in chat else "groupChat" if chat == GROUP else "personal"
        await self._post(self.teams.activity(conversation=chat, user=_USERS[who], text="", name=who, kind=kind,
                                             replyToId=card.id, value={"switchboard": command}))

    async def redeliver(self, sent: Sent) -> None:
        await self._post(sent.event)

    async def out_of_order(self, who: str, texts: tuple[str, str]) -> tuple[Sent, Sent]:
        first, second = (self.teams.activity(conversation=_dm(who), user=_USERS[who], text=t, name=who) for t in texts)
        await self._post(second)
        await self._post(first)
        key = f"agent:main:teams:dm:{_part(_dm(who))}"
        return Sent(_dm(who), key, first), Sent(_dm(who), key, second)

    async def malformed(self) -> int:
        good = self.teams.activity(conversation=_dm("ann"), user=_USERS["ann"], text="x", name="ann")
        signed_but_bad = [
            {"type": "message", "channelId": "msteams"},  # no conversation, no id, no sender
            dict(good, id=12, text=["not", "a", "string"]),
            dict(good, conversation=None),
            dict(good, attachments="nope", entities={"not": "a list"}),
            dict(good, serviceUrl="http://attacker.example/"),  # our token must never go there
        ]
        for activity in signed_but_bad:
            assert await self.teams.post(activity) in (200, 400), activity
        # refused outright: no token, a token signed with a key nobody published, a body that is no object
        assert await self.teams.post(dict(good, text="unsigned"), signed=False) == 401
        assert await self.teams.post(dict(good, text="wrongly signed"), wrong_key=True) == 401
        assert await self.teams.post(b"[1, 2, 3]") == 400
        return len(signed_but_bad) + 3

    # -- what the chats show

    def shown(self, chat: str) -> list[str]:
        return [s.text for s in self.teams.shown(chat)]

    def buttons(self, chat: str) -> list[str]:
        return [c for s in self.teams.shown(chat) for c in s.commands]

    def send_times(self, chat: str) -> list[float]:
        return self.teams.times(chat)

    def edits(self, chat: str) -> int:
        return sum(s.edits for s in self.teams.shown(chat))

    # -- faults

    def fail_sends(self, times: int = 1, *, status: int = 429, retry_after: float = 1.0) -> None:
        self.teams.fail_next(times, status=status, retry_after=retry_after)

    def slow_sends(self, seconds: float, times: int = 1) -> None:
        self.teams.delay_next(seconds, times)

    async def drop_connection(self) -> None:
        await self.teams.drop_connection()

    def crash_side(self):
        return TeamsSide(self.teams)

    def chaos_plan(self, seed: int):
        return Plan(kills=1, rate=10, chats=4, retire=4, load_seconds=(0.8, 2.0), seed=seed)


class TeamsSide:
    """The messaging endpoint: an activity the killed daemon did not answer 200 is sent again."""

    name = "teams"
    redelivers = True
    # activities of one chat are handed over in the order they arrive, but one sent again after the
    # restart can arrive after a newer one of the same chat: counted, not failed
    keeps_order = False
    # A user's message is Teams' once written: send() hands it to the fake's delivery (in the order
    # written, each sent again until accepted) and returns.  (It used to await the POST, so the load,
    # cancelled as the last daemon came up, could be cancelled after the activity reached the daemon
    # and before crashkit recorded it as written: a stored message nobody wrote, the model shown "more
    # messages than written".)

    def __init__(self, fake: FakeTeams):
        self.fake = fake
        self.fake.redeliver = True
        self.port = _free_port()
        self.fake.endpoint = f"http://127.0.0.1:{self.port}{MESSAGES_PATH}"

    def settings(self) -> dict:
        return {"api": {"port": self.port},
                "platforms": {"teams": {"app_id": self.fake.app_id, "app_password": self.fake.app_password,
                                        "openid_metadata_url": self.fake.metadata_url,
                                        "token_url": self.fake.token_url, "service_url": self.fake.service_url}}}

    def chat_of(self, index: int) -> str:
        return f"a:dm-user{index}"

    async def ready(self, start: Start, timeout: float) -> None:
        await eventually(lambda: any(c.method == "keys" and c.at >= start.spawned for c in self.fake.calls),
                         timeout, "the daemon to read the signing keys")
        await eventually(self._listening, timeout, "the daemon's messaging endpoint")

    async def _listening(self) -> bool:
        import asyncio

        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        return True

    async def send(self, index: int, text: str) -> bool:
        self.fake.deliver(self.fake.activity(conversation=self.chat_of(index), user=f"29:user{index}", text=text,
                                             name=f"user{index}"))
        return True

    def replies(self) -> list[BotReply]:
        return [BotReply(conversation, s.text, s.at, s.id) for conversation, shown in self.fake.conversations.items()
                for s in shown]

    def notes(self) -> dict[str, int]:
        return {"activities sent again": len(self.fake.deliveries) - len({a for a, _ in self.fake.deliveries}),
                "activities never acknowledged": len(self.fake.unacknowledged()),
                "activities still to deliver": self.fake.undelivered()}
