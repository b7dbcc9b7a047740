"""SIGKILL the instance that owns the Matrix /sync of a cluster while users write (tests/test_cluster_kills.py's
cluster of real daemons on one PostgreSQL store, against tests/fakes/matrix.py).

The sync token lives in the shared store (``chat_prefs`` under ``adapter:matrix``), so the standby that
takes the connection over asks its first /sync from the token the dead owner stored last: nothing it had
stored is read again from the start, and what it had not stored comes again and is answered once.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from tests.fakes.matrix import FakeMatrix
from tests.fakes.model_server import FakeModel
from tests.harness import eventually
from tests.platformkit.matrix import MatrixSide
from tests.test_cluster_kills import MODEL_SECONDS, Cluster, Load, _outcome, _settle, check


def stored_token(url: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT value FROM chat_prefs WHERE session_key = 'adapter:matrix' "
                           "AND name = 'next_batch'").fetchone()
    return row[0] if row else None


async def test_a_standby_takes_the_matrix_sync_over_from_a_killed_owner_and_resumes_from_its_token(tmp_path, pg_url):
    async with FakeMatrix(rate=50.0, burst=50) as hs, FakeModel(delay=MODEL_SECONDS) as model:
        side = MatrixSide(hs, encryption=False)  # E2EE is refused with a cluster (one crypto store)
        cluster = Cluster(tmp_path, pg_url, model.base_url, side, ("a", "b"))
        load = Load(side, total=120, at_once=8, retire=4, rate=15.0)
        killed = load.hold_at(60)
        async with cluster:
            first = await cluster.start_under_load("matrix", eventually(lambda: hs.syncs > 0, 30.0, "a /sync"), load)
            await cluster.freeze_with_work_left(first, load.retiring())
            load.next_cycle()
            await cluster.kill(first)
            killed_at = time.monotonic()
            left_at = await asyncio.to_thread(stored_token, pg_url)
            killed.set()

            second = await cluster.owner("matrix")
            await eventually(lambda: any(at > killed_at for at in hs.sync_at), 30.0, "the standby's first /sync")
            await cluster.writing_done()
            await _settle(side, load, pg_url, 60.0)
            exit_code = await cluster.close()
        outcome = _outcome(side, load, cluster, exit_code)
    check(outcome)
    assert second is not first
    resumed = next(since for at, since in zip(hs.sync_at, hs.sync_since, strict=True) if at > killed_at)
    assert left_at is not None and left_at.startswith("s") and int(left_at[1:]) > 0
    assert resumed == left_at, f"the takeover's first /sync asked since={resumed}, the store held {left_at}"
    assert "this instance now owns matrix:" in second.log_path(0).read_text(), second.log_tail()
