"""Duplicates a user sees when instances die mid-stream: SIGKILL 20 times, count what the chats show.

Three real ``switchboard run`` daemons (tests/clusterdaemons.py) on a throw-away PostgreSQL
(tests/pgserver.py), the fake Telegram (long polling; instance a owns the poller) and the fake model,
streaming each answer slowly (about --stream-seconds), so a kill lands while replies are being
streamed.  --chats users write DMs at --rate a second in all; every --every seconds the instance
(b or c, never the poller's owner) that holds the most turns gets SIGKILL and is started again at
once; its sessions' leases run out (``cluster.lease_seconds``, 3 here) and whichever instance
claims them answers.  After the last kill, the run waits until nothing is left unanswered.

Printed, from what the fake Telegram shows at the end (each bot message's final text):

* answers: messages that answer a user message (the fake model echoes it);
* duplicates: bot messages beyond one per answer (the same echo twice, a partial left as it was,
  or a partial said to be "cut short" followed by a second answer), per kill;
* in flight: messages the platform accepted up to a kill that the store never noted as posted
  (the instance died between the two): the duplicates the platform forces, at most;
* unanswered: user messages never answered (should be 0; a turn answers every message its chat
  sent since the last answer, and echoes the last of them);
* the oldest unanswered message's age, as /healthz of instance a showed it (sampled every 0.5 s).

    .venv/bin/python bench/cluster_kills.py [--kills 20] [--chats 12] [--rate 4] [--every 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.streaming import CUT_SHORT
from tests.clusterdaemons import after_kill, count_in_flight, health, instance_dir, instance_settings, recorded_ids
from tests.crashkit import Daemon, Kill, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.pgserver import PgCluster, why_unavailable
from tests.waiting import eventually

_ECHO = re.compile(r"echo: (c\d+ m\d+)")
PADDING = " and so on" * 24  # the answer streams for a while after its first part shows


def _settings(url: str, name: str, model_url: str, side: TelegramSide) -> dict:
    settings = instance_settings(url, name, model_url, cluster={"failover_seconds": 5, "lease_seconds": 3},
                                 **side.settings())
    settings["streaming"] = {"edit_interval_seconds": 0.3}
    settings["logging"] = {"level": "WARNING", "format": "text"}
    return settings


def count(replies: list, sent_texts: set[str]) -> tuple[int, int, int, dict[str, int]]:
    """(answers, duplicates, unanswered, kinds of duplicate) from each bot message's final text."""
    by_chat: dict[str, list[str]] = defaultdict(list)
    for reply in replies:
        by_chat[reply.chat].append(reply.text.strip())
    answered: set[str] = set()
    answers = duplicates = 0
    kinds: dict[str, int] = defaultdict(int)
    for texts in by_chat.values():
        seen: set[str] = set()
        for i, text in enumerate(texts):
            if CUT_SHORT.strip("_") in text:
                duplicates += 1
                kinds["said cut short, answered again"] += 1
                continue
            if text in ("…", ""):
                continue  # an adopted part the answer did not need
            match = _ECHO.search(text)
            if match is None or match.group(1) not in sent_texts:
                # a partial whose final edit never came: a prefix of another message here
                if any(other != text and other.startswith(text) for other in texts[i + 1:] + texts[:i]):
                    duplicates += 1
                    kinds["partial left, answered again"] += 1
                continue
            echoed = match.group(1)
            if echoed in seen:
                duplicates += 1
                kinds["the same answer twice"] += 1
                continue
            seen.add(echoed)
            answered.add(echoed)
            answers += 1
    # a turn answers every message its chat sent since the last answer, echoing the last of them
    latest: dict[str, int] = {}
    for text in answered:
        chat, n = text.split()
        latest[chat] = max(latest.get(chat, -1), int(n[1:]))
    unanswered = [t for t in sent_texts if int(t.split()[1][1:]) > latest.get(t.split()[0], -1)]
    return answers, duplicates, len(unanswered), dict(kinds)


async def run(url: str, args: argparse.Namespace, tmp: Path) -> None:
    rng = random.Random(args.seed)
    async with FakeTelegram() as tg, FakeModel(delay=0.1) as model:
        model.stream_chunk_chars = 8
        model.stream_interval = args.stream_seconds * 8 / (60 + len(PADDING))
        model.responder = lambda messages: model.default_reply(messages) + PADDING
        side = TelegramSide(tg)
        daemons = {name: Daemon(instance_dir(tmp, name), _settings(url, name, model.base_url, side))
                   for name in ("a", "b", "c")}
        sent: list[str] = []
        kills: list[Kill] = []
        oldest = 0.0
        try:
            await side.ready(await daemons["a"].start(), 30.0)
            await asyncio.gather(daemons["b"].start(), daemons["c"].start())

            async def users() -> None:
                n = 0
                while True:
                    index = n % args.chats
                    text = f"c{index:03d} m{n:04d}"
                    await side.send(index, text)
                    sent.append(text)
                    n += 1
                    await asyncio.sleep(1 / args.rate)

            async def watch() -> None:
                nonlocal oldest
                while True:
                    try:
                        shown = (await health(daemons["a"]))["unanswered"] or {}
                        oldest = max(oldest, shown.get("oldest_seconds") or 0.0)
                    except Exception:  # noqa: BLE001 - a missed sample
                        pass
                    await asyncio.sleep(0.5)

            writing, watching = asyncio.create_task(users()), asyncio.create_task(watch())
            await asyncio.sleep(args.every)
            for k in range(args.kills):
                held = {}
                for name in ("b", "c"):
                    try:
                        held[name] = len((await health(daemons[name]))["cluster"]["claims"]["turns"])
                    except Exception:  # noqa: BLE001 - still starting
                        held[name] = -1
                top = max(held.values())
                victim = daemons[rng.choice([name for name, n in held.items() if n == top])]
                await victim.kill()
                kills.append(await asyncio.to_thread(after_kill, url, time.monotonic()))
                print(f"  kill {k + 1:2d}: {victim.workdir.name} (held {top} turns)", flush=True)
                await victim.start()
                await asyncio.sleep(max(0.0, args.every - 1.0) * (0.5 + rng.random()))
            writing.cancel()

            async def settled() -> bool:
                shown = (await health(daemons["a"]))["unanswered"] or {}
                return shown.get("sessions") == 0 and count(side.replies(), set(sent))[2] == 0

            try:
                await eventually(settled, 60.0, "everything answered", every=0.5)
            except AssertionError:
                print("  (not everything was answered within 60 s)")
            await asyncio.sleep(2.0)  # final edits land
            watching.cancel()
            replies = side.replies()
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
    in_flight_after = count_in_flight(kills, replies, await asyncio.to_thread(recorded_ids, url))
    answers, duplicates, unanswered, kinds = count(replies, set(sent))
    in_flight = sum(kill.in_flight for kill in kills)
    print(f"{len(kills)} kills, {len(sent)} DMs from {args.chats} chats, {len(replies)} bot messages")
    print(f"  answers: {answers}; unanswered: {unanswered}")
    print(f"  duplicates: {duplicates} ({duplicates / max(1, len(kills)):.2f} per kill) {kinds or ''}")
    print(f"  sends in flight at the kills (accepted, never noted): {in_flight} "
          f"({in_flight / max(1, len(kills)):.2f} per kill); unnoted after the last kill: {len(in_flight_after)}")
    print(f"  oldest unanswered message seen on /healthz: {oldest:.1f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--rate", type=float, default=4.0, help="DMs a second, all chats together")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between kills, on average")
    parser.add_argument("--stream-seconds", type=float, default=2.0, help="how long an answer streams")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # a killed daemon's stream breaks off
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    cluster = PgCluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await run(cluster.fresh_database(), args, Path(tmp))
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
