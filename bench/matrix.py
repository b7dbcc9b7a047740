"""Matrix against a real Synapse: message to reply shown, and a streamed answer's edits.

A Synapse (tests/synapse.py: matrix-synapse from the test extra, SQLite, 127.0.0.1) and the real
gateway with the Matrix adapter in this process, the fake model answering at once.  A user writes
200 DMs one after another into one DM room; each latency runs from just before the user's PUT of the
message to the moment the user's own /sync (a long poll, as a client waits) shows the bot's reply:
the homeserver both ways, the adapter's /sync, the router, the store, the HTTP hop to the model, the
send.  The model's own time (a request's arrival to its answer being ready) is measured on each
request and taken out, as issue #42 asks.  Then one streamed answer of 2,000 characters (the model
writing 20 characters every 50 ms, 5 s in all) at the default streaming settings, and the m.replace
edits it took.

    .venv/bin/python bench/matrix.py [--messages 200]
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
from tests.fakes.model_server import FakeModel, Reply
from tests.harness import eventually, gateway_config
from tests.synapse import Client, started_synapse

PACE = 0.6  # seconds from one message to the next, at least


def _sync(client: Client, since: str | None, timeout_ms: int = 10_000) -> dict:
    query = {"timeout": str(timeout_ms)} | ({"since": since} if since else {})
    return client.call("GET", "/sync", query=query)


def _events(batch: dict, room: str) -> list[dict]:
    return batch.get("rooms", {}).get("join", {}).get(room, {}).get("timeline", {}).get("events", [])


def _wait_reply(client: Client, room: str, bot: str, text: str, since: str) -> tuple[float, str]:
    """Until the user's /sync shows the bot's echo of ``text``; (when, the next since)."""
    while True:
        batch = _sync(client, since)
        since = batch["next_batch"]
        for e in _events(batch, room):
            if e.get("sender") == bot and e["content"].get("body", "").startswith(f"echo: {text} |"):
                return time.perf_counter(), since


def _model_seconds(model: FakeModel, text: str) -> float:
    """The model's own time on the request that answered ``text``: its arrival to its answer being ready."""
    for record in reversed(model.requests):
        if record.last_user_text == text and record.answered is not None:
            return record.answered - record.at
    raise AssertionError(f"no model request answered {text!r}")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def main(messages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, started_synapse(Path(tmp) / "synapse") as hs:
        bot, ann = hs.register("bot"), hs.register("ann")
        async with FakeModel() as model:
            # replies whole, as bench/adapters.py measures them: a streamed short reply waits for more text
            # (streaming.first_after_seconds) before its first post
            config = gateway_config(Path(tmp) / "home", model.base_url, logging={"level": "WARNING"},
                                    streaming={"enabled": False},
                                    platforms={"matrix": {"homeserver": hs.base_url, "access_token": bot.token,
                                                          "allowed_users": [ann.user_id]}})
            gw = Gateway(config, serve_api=False)
            await gw.start()
            try:
                await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", 30, "connected")
                room = await asyncio.to_thread(ann.create_room, invite=[bot.user_id], direct=True)
                since = (await asyncio.to_thread(_sync, ann, None, 0))["next_batch"]
                await asyncio.to_thread(ann.say, room, "warm up")
                _, since = await asyncio.to_thread(_wait_reply, ann, room, bot.user_id, "warm up", since)
                latencies: list[float] = []
                model_times: list[float] = []
                started = time.perf_counter()
                for i in range(messages):
                    text = f"message {i}"
                    if latencies:  # a person's pace, under the room's 2 events a second
                        await asyncio.sleep(max(0.0, PACE - (time.perf_counter() - started)))
                    started = time.perf_counter()
                    await asyncio.to_thread(ann.say, room, text)
                    shown, since = await asyncio.to_thread(_wait_reply, ann, room, bot.user_id, text, since)
                    spent = _model_seconds(model, text)
                    model_times.append(spent)
                    latencies.append(shown - started - spent)
                print(f"matrix (real Synapse {hs.base_url}): message to reply shown over {messages} DMs, the model's "
                      f"time taken out: p50 {statistics.median(latencies) * 1000:.0f} ms, "
                      f"p95 {pct(latencies, 95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms "
                      f"(the fake model's own time, taken out: p50 {statistics.median(model_times) * 1000:.1f} ms)")
            finally:
                await gw.stop(grace_seconds=5)

            # a second home with the same token is the same device with a second crypto store, whose new keys
            # the server refuses (the room is unencrypted, so nothing here needs them): encryption off there
            config = gateway_config(Path(tmp) / "home2", model.base_url, logging={"level": "WARNING"},
                                    streaming={"enabled": True},
                                    platforms={"matrix": {"homeserver": hs.base_url, "access_token": bot.token,
                                                          "allowed_users": [ann.user_id], "encryption": False}})
            gw = Gateway(config, serve_api=False)
            await gw.start()
            try:
                await eventually(lambda: gw.health()["platforms"]["matrix"]["state"] == "connected", 30, "connected")
                answer = " ".join(f"w{i:04d}" for i in range(400))[:2000]
                model.stream_chunk_chars, model.stream_interval = 20, 0.05
                model.script(Reply(answer))
                asked = await asyncio.to_thread(ann.say, room, "stream 2000 characters")
                started = time.perf_counter()

                def edits() -> list[dict]:
                    """The m.replace edits of the bot's first message after the question."""
                    events = ann.messages(room, limit=200)
                    after = events[next(i for i, e in enumerate(events) if e["event_id"] == asked) + 1:]
                    ours = [e for e in after if e["sender"] == bot.user_id and e["type"] == "m.room.message"]
                    posted = [e for e in ours if (e["content"].get("m.relates_to") or {}).get("rel_type") != "m.replace"]
                    return [e for e in ours if posted and (e["content"].get("m.relates_to") or {}).get("event_id")
                            == posted[0]["event_id"]]

                async def whole() -> bool:
                    found = await asyncio.to_thread(edits)
                    return bool(found) and found[-1]["content"]["m.new_content"]["body"].strip() == answer

                await eventually(whole, 60, "the whole streamed answer", every=0.2)
                done = time.perf_counter() - started
                count = len(await asyncio.to_thread(edits))
                print(f"matrix: a streamed {len(answer)}-character answer (written over "
                      f"{len(answer) / 20 * 0.05:.1f} s): {count} m.replace edits after its first post, "
                      f"whole after {done:.1f} s")
            finally:
                await gw.stop(grace_seconds=5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    asyncio.run(main(parser.parse_args().messages))
