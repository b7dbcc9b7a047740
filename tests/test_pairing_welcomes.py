"""The welcome poll (gateway/runtime/welcome.py): an approved user is told so and their waiting message
answered by the instance that serves their platform; one that serves none (a cluster's standby) leaves
the row to it and reads nothing."""

from __future__ import annotations

import time

from gateway.runtime.welcome import ANSWERING_LINE, Welcomes
from gateway.types import ChatType, InboundMessage, message_json
from state import AsyncSessionDB, SessionDB


class CountedReads:
    """The store as Welcomes sees it, counting its reads of the waiting welcomes."""

    def __init__(self, db: AsyncSessionDB):
        self.pairing = self
        self._db = db
        self.reads = 0

    async def welcomes(self) -> list[dict]:
        self.reads += 1
        return await self._db.pairing.welcomes()

    async def welcomed(self, platform: str, user_id: str) -> bool:
        return await self._db.pairing.welcomed(platform, user_id)


async def test_only_the_instance_serving_a_platform_reads_and_answers_its_approved_users(tmp_path):
    db = SessionDB(tmp_path / "state.db")
    adb = AsyncSessionDB(db)
    try:
        msg = InboundMessage(platform="telegram", chat_type=ChatType.DM, chat_id="7", user_id="7", text="hello?")
        db.pairing.request("telegram", "7", "Ann", "ABCD2345", now=time.time(), ttl=600, max_pending=3,
                           waiting=message_json(msg))
        db.pairing.approve("telegram", "ABCD2345")
        told: list[tuple[str, str]] = []
        answered: list[str] = []

        async def deliver(chat, text):
            told.append((chat.chat_id, text))

        async def inbound(message):
            answered.append(message.text)

        standby_store, owner_store = CountedReads(adb), CountedReads(adb)
        standby = Welcomes(standby_store, deliver, inbound, serves=lambda platform: False, serving=lambda: False)
        owner = Welcomes(owner_store, deliver, inbound, serves=lambda platform: platform == "telegram")
        await standby.tick()
        assert (standby_store.reads, told, answered) == (0, [], [])  # the row waits for the owner
        await owner.tick()
        assert (told, answered) == ([("7", ANSWERING_LINE)], ["hello?"])
        assert await adb.pairing.welcomes() == []
    finally:
        await adb.close()
