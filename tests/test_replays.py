"""The store's record of accepted signatures (``db.replays``), on SQLite and PostgreSQL: a signature is
claimed once per scope, by any number of connections at once; it is a replay once its request is stored;
a released, lapsed (its process died before storing) or expired one can be claimed again."""

from __future__ import annotations

import asyncio

from state import AsyncSessionDB, SessionDB


def test_a_signature_is_a_replay_once_its_request_is_stored_until_it_expires_or_is_released(store_target):
    with SessionDB(store_target) as db:
        def claim(scope: str, now: float, keep_until: float = 1300.0) -> str:
            return db.replays.claim(scope, "sha256=aa", keep_until=keep_until, held_until=now + 30, now=now)

        assert claim("webhook:ci", 1000.0) == "taken"
        assert claim("webhook:ci", 1001.0) == "in_flight"  # its request is on its way into the store
        db.replays.stored("webhook:ci", "sha256=aa")
        assert claim("webhook:ci", 1002.0) == "replay"
        assert claim("webhook:ci", 1100.0) == "replay"  # a stored claim never lapses, it expires
        assert claim("webhook:cd", 1001.0) == "taken"  # another hook's
        db.replays.release("webhook:ci", "sha256=aa")  # its request was not stored: the retry is taken
        assert claim("webhook:ci", 1002.0) == "taken"
        assert claim("webhook:ci", 1600.0, keep_until=1900.0) == "taken"  # kept until 1300 only


def test_a_claim_whose_process_died_before_storing_lapses_and_one_resend_takes_it_over(store_target):
    with SessionDB(store_target) as db:
        assert db.replays.claim("webhook:ci", "sha256=cc", keep_until=1300.0, held_until=1030.0,
                                now=1000.0) == "taken"  # then kill -9: neither stored nor released
        assert db.replays.claim("webhook:ci", "sha256=cc", keep_until=1300.0, held_until=1059.0,
                                now=1029.0) == "in_flight"
        assert db.replays.claim("webhook:ci", "sha256=cc", keep_until=1300.0, held_until=1061.0,
                                now=1031.0) == "taken"  # the resend, once the hold lapsed
        assert db.replays.claim("webhook:ci", "sha256=cc", keep_until=1300.0, held_until=1062.0,
                                now=1032.0) == "in_flight"  # held for the resend now
        db.replays.stored("webhook:ci", "sha256=cc")
        assert db.replays.claim("webhook:ci", "sha256=cc", keep_until=1300.0, held_until=1100.0,
                                now=1070.0) == "replay"


async def test_of_many_claims_at_once_through_separate_stores_exactly_one_wins(store_target):
    stores = [AsyncSessionDB(SessionDB(store_target)) for _ in range(4)]
    try:
        won = await asyncio.gather(*(adb.replays.claim("webhook:ci", "sha256=bb", keep_until=2000.0,
                                                       held_until=1030.0, now=1000.0)
                                     for adb in stores for _ in range(3)))
        lapsed = await asyncio.gather(*(adb.replays.claim("webhook:ci", "sha256=bb", keep_until=2000.0,
                                                          held_until=1061.0, now=1031.0)
                                        for adb in stores for _ in range(3)))
    finally:
        for adb in stores:
            await adb.close()
    assert sorted(won) == ["in_flight"] * 11 + ["taken"]
    assert sorted(lapsed) == ["in_flight"] * 11 + ["taken"]  # of many resends after a crash, one takes it
