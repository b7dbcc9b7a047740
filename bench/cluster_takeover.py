"""Seconds from SIGKILL of the instance owning the Telegram poller to the first answer after it.

Real ``switchboard run`` daemons (tests/crashkit.py's ``Daemon``, configured as
tests/clusterdaemons.py does) on a throw-away PostgreSQL (tests/pgserver.py), the
fake Telegram in long-polling mode and the fake model (--delay, default 200 ms).
Two instances: one owns the poller, one stands by.  For each of --kills kills, at
a random moment (0-1 s after the cluster settled), the owner gets SIGKILL and a
user writes a DM at once; the figure is the time from the kill to the fake
Telegram accepting the reply to that DM: the standby taking the poller over
(``cluster.failover_seconds``), its first getUpdates, a turn on whichever
instance claims the session, and the send.  The killed instance is then started
again as the new standby.

Target: at most 10 s with the default ``failover_seconds: 10``.  No timed
assertion: the figures are for reading.

    .venv/bin/python bench/cluster_takeover.py [--kills 10] [--failover 10] [--delay 0.2] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.clusterdaemons import instance_dir, instance_settings, owner_of
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually
from tests.pgserver import PgCluster, why_unavailable

ANSWER_TIMEOUT = 60.0


async def _answered(tg: FakeTelegram, text: str, after: float) -> float:
    """When the fake Telegram accepted the bot's reply to the DM ``text`` (sent at or after ``after``)."""
    def seen() -> float | None:
        return next((m.at for m in tg.sent if m.at >= after and f"echo: {text} |" in m.visible_text), None)

    return await eventually(seen, ANSWER_TIMEOUT, f"the answer to {text!r}", every=0.02)


async def _standing_by(daemons: list[Daemon]) -> Daemon:
    """The owner, once every instance runs and one of them owns the poller."""
    return await eventually(lambda: owner_of(daemons, "telegram"), 60.0, "an instance to own the poller")


async def measure(args: argparse.Namespace, cluster: PgCluster, tmp: Path) -> list[float]:
    url = cluster.fresh_database()
    rng = random.Random(args.seed)
    seconds: list[float] = []
    async with FakeTelegram() as tg, FakeModel(delay=args.delay) as model:
        side = TelegramSide(tg)
        daemons = [Daemon(instance_dir(tmp, name), instance_settings(
            url, name, model.base_url, cluster={"failover_seconds": args.failover}, **side.settings()))
            for name in ("a", "b")]
        try:
            await side.ready(await daemons[0].start(), 60.0)
            await daemons[1].start()
            for kill in range(args.kills):
                owner = await _standing_by(daemons)
                await side.send(kill, f"warm {kill}")  # the chat has its session before the kill
                await _answered(tg, f"warm {kill}", 0.0)
                await asyncio.sleep(rng.uniform(0.0, 1.0))  # a random point of the poll and the standby's watch
                killed_at = time.monotonic()
                assert owner.proc is not None
                owner.proc.kill()
                await side.send(kill, f"probe {kill}")
                answered_at = await _answered(tg, f"probe {kill}", killed_at)
                seconds.append(answered_at - killed_at)
                print(f"kill {kill + 1}: {seconds[-1]:.2f} s", flush=True)
                await owner.proc.wait()
                await owner.start()  # the next standby
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
    return seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--failover", type=float, default=10.0, help="cluster.failover_seconds (at least 5)")
    parser.add_argument("--delay", type=float, default=0.2, help="the fake model's seconds per answer")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"no PostgreSQL server can be started here: {reason}")
    logging.basicConfig(level=logging.WARNING)
    cluster = PgCluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="switchboard-takeover-") as tmp:
            seconds = await measure(args, cluster, Path(tmp))
    finally:
        cluster.stop()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"\nSIGKILL of the poller's owner -> the answer to a DM written at the kill, {len(seconds)} kills, "
          f"failover_seconds {args.failover:g}, model {args.delay * 1000:.0f} ms, load average {load}")
    print(f"p50 {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s, min {min(seconds):.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
