"""Matrix end-to-end encrypted against a real Synapse: message to decrypted reply, in an encrypted DM.

A Synapse (tests/synapse.py) and the real gateway with the Matrix adapter in this process, the fake
model answering at once; the user is an encrypting matrix-nio client with its own crypto store
(tests/matrix_client.py).  Each latency runs from just before the user encrypts and sends the
message to the moment the user's own sync decrypts the bot's reply: Megolm both ways, the to-device
room key on the first message, the adapter's /sync, the router, the store, the model's HTTP hop, the
send.  The user's sync is a long poll (of 200 ms at most) that returns as the reply arrives; the fake
model's own time is a millisecond or so and left in.

    .venv/bin/python bench/matrix_e2ee.py [--messages 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, gateway_config
from tests.matrix_client import Encrypting
from tests.synapse import started_synapse

PACE = 0.6  # seconds from one message to the next, at least (the room's budget is 2 events a second)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def _replied(ann: Encrypting, room: str, bot: str, text: str) -> float:
    while not any(r == room and who == bot and b.startswith(f"echo: {text} |") for r, who, b in ann.read):
        await ann.sync()
    return time.perf_counter()


async def main(messages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, started_synapse(Path(tmp) / "synapse") as hs:
        bot, person = hs.register("bot"), hs.register("ann")
        async with FakeModel() as model:
            config = gateway_config(Path(tmp) / "home", model.base_url, logging={"level": "WARNING"},
                                    streaming={"enabled": False},
                                    platforms={"matrix": {"homeserver": hs.base_url, "access_token": bot.token,
                                                          "allowed_users": [person.user_id]}})
            gw = Gateway(config, serve_api=False)
            await gw.start()
            ann = Encrypting(person, Path(tmp) / "ann-device")
            try:
                await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", 30, "connected")
                room = await asyncio.to_thread(person.create_room, invite=[bot.user_id], direct=True, encrypted=True)
                await ann.open()
                await eventually(lambda: _joined(ann, room, bot.user_id), 30, "the bot in the room")
                first = time.perf_counter()
                await ann.say(room, "warm up")
                warm = await asyncio.wait_for(_replied(ann, room, bot.user_id, "warm up"), 60) - first
                latencies: list[float] = []
                started = time.perf_counter()
                for i in range(messages):
                    await asyncio.sleep(max(0.0, PACE - (time.perf_counter() - started)))
                    started = time.perf_counter()
                    await ann.say(room, f"secret {i}")
                    shown = await asyncio.wait_for(_replied(ann, room, bot.user_id, f"secret {i}"), 60)
                    latencies.append(shown - started)
                print(f"matrix E2EE (real Synapse, matrix-nio on vodozemac both sides): message to decrypted reply "
                      f"over {messages} encrypted DMs: p50 {statistics.median(latencies) * 1000:.0f} ms, "
                      f"p95 {pct(latencies, 95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; the first "
                      f"message (room keys shared both ways first) {warm * 1000:.0f} ms")
            finally:
                await ann.close()
                await gw.stop(grace_seconds=5)


async def _joined(ann: Encrypting, room: str, bot: str) -> bool:
    await ann.sync()
    assert ann.nio is not None
    joined = ann.nio.rooms.get(room)
    return joined is not None and bot in joined.users


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100)
    asyncio.run(main(parser.parse_args().messages))
