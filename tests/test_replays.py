"""The store's record of accepted signatures (``db.replays``), on SQLite and PostgreSQL: a signature is
claimed once per scope, by any number of connections at once; a released or expired one can be again."""

from __future__ import annotations

import asyncio

from state import AsyncSessionDB, SessionDB


def test_a_signature_is_claimed_once_per_scope_until_it_expires_or_is_released(store_target):
    with SessionDB(store_target) as db:
        claim = db.replays.claim
        assert claim("webhook:ci", "sha256=aa", keep_until=1300.0, now=1000.0) is True
        assert claim("webhook:ci", "sha256=aa", keep_until=1300.0, now=1001.0) is False  # the replay
        assert claim("webhook:cd", "sha256=aa", keep_until=1300.0, now=1001.0) is True  # another hook's
        db.replays.release("webhook:ci", "sha256=aa")  # its request was not stored: the retry is taken
        assert claim("webhook:ci", "sha256=aa", keep_until=1300.0, now=1002.0) is True
        assert claim("webhook:ci", "sha256=aa", keep_until=1600.0, now=1300.5) is True  # kept until 1300 only


async def test_of_many_claims_at_once_through_separate_stores_exactly_one_wins(store_target):
    stores = [AsyncSessionDB(SessionDB(store_target)) for _ in range(4)]
    try:
        won = await asyncio.gather(*(adb.replays.claim("webhook:ci", "sha256=bb", keep_until=2000.0, now=1000.0)
                                     for adb in stores for _ in range(3)))
    finally:
        for adb in stores:
            await adb.close()
    assert sorted(won) == [False] * 11 + [True]
