"""Voice turns: what transcribing a voice message adds to a turn, beyond the transcription endpoint's own time.

Telegram users send, one after another, a text message and a voice note (OGG/Opus, its duration
given), ``--turns`` times each.  The real gateway, python-telegram-bot and the ``openai`` SDK run in
this process against the fake Telegram; the fake model (chat and audio API) runs in another process,
its transcriptions taking ``--transcribe`` seconds, and reports when each transcription request
arrived and was answered (the system's monotonic clock, comparable across the processes).

Each turn is timed (and its CPU in this process taken) from the update's arrival at the fake Telegram to the fake Telegram taking the
answer.  The figure: a voice turn's time, less its transcription request's own time (arrival to
answer, measured by the fake), less the median text turn (polling, the turn, the send): what the
voice path itself costs (the download, the placeholder stored, the multipart request built and
read, the transcript stored), p50 / p95.

    .venv/bin/python bench/voice.py [--turns 100] [--transcribe 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.runtime.daemon import Gateway
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config
from tests.voicekit import ogg_opus


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def start_model(transcribe: float) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.model_server", "--transcribe-delay", str(transcribe),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int((await proc.stdout.readline()).split()[1])


async def timed(tg: FakeTelegram, push, cpu: list[float]) -> float:
    """Seconds from pushing an update to the fake Telegram taking its answer; this process's CPU appended."""
    before = len(tg.sent)
    started, used = time.monotonic(), time.process_time()
    push()
    await tg.wait_for(lambda: len(tg.sent) > before, timeout=60, what="the answer")
    cpu.append((time.process_time() - used) * 1000)
    return tg.sent[before].at - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--transcribe", type=float, default=0.3, help="seconds each transcription takes")
    args = parser.parse_args()
    model, port = await start_model(args.transcribe)
    note = ogg_opus(6, filler=12_000)  # about 13 KB: a 6 s voice note
    try:
        async with FakeTelegram() as tg:
            with tempfile.TemporaryDirectory() as home:
                config = gateway_config(
                    Path(home), f"http://127.0.0.1:{port}/v1", auth={"allow_all": True},
                    logging={"level": "WARNING"}, streaming={"enabled": False},
                    platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                    media={"transcribe_with": "whisper-1"})
                gw = Gateway(config, serve_api=False)
                await gw.start()
                try:
                    await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected",
                                      what="connected")
                    text, voice, text_cpu, voice_cpu = [], [], [], []
                    for i in range(args.turns + 5):  # the first 5 of each warm up
                        # a chat each: Telegram's budget of about one send a second per chat stays out of it
                        ann, bob = FakeTelegram.user(10_000 + i, "Ann"), FakeTelegram.user(20_000 + i, "Bob")
                        t = await timed(tg, lambda ann=ann: tg.dm(ann, "hello from a voice note"), text_cpu)
                        v = await timed(tg, lambda bob=bob, i=i: tg.dm(
                            bob, None, voice=tg.voice_note(f"v{i}", note, duration=6)), voice_cpu)
                        if i >= 5:
                            text.append(t)
                            voice.append(v)
                finally:
                    await gw.stop(grace_seconds=5)
        timings = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/_transcriptions").read())[5:]
    finally:
        model.terminate()
        await model.wait()
    own = [t["answered"] - t["at"] for t in timings]
    base = statistics.median(text)
    added = [(v - o - base) * 1000 for v, o in zip(voice, own, strict=True)]
    ms = [x * 1000 for x in text]
    print(f"voice turns: {args.turns} voice notes and {args.turns} text messages, a chat each, "
          f"transcription {args.transcribe * 1000:.0f} ms")
    print(f"  text turn (update -> answer taken): p50 {statistics.median(ms):.1f} ms, p95 {pct(ms, 0.95):.1f} ms")
    print(f"  voice turn: p50 {statistics.median(voice) * 1000:.1f} ms, p95 {pct(voice, 0.95) * 1000:.1f} ms; "
          f"the endpoint's own time p50 {statistics.median(own) * 1000:.1f} ms")
    print(f"  added by the voice path (voice turn - endpoint's own time - median text turn): "
          f"p50 {statistics.median(added):.1f} ms, p95 {pct(added, 0.95):.1f} ms (target p95 <= 100 ms)")
    print(f"  CPU of this process (gateway and fake Telegram) per turn: text p50 {statistics.median(text_cpu[5:]):.1f} ms, "
          f"voice p50 {statistics.median(voice_cpu[5:]):.1f} ms")
    print(f"  for scale, the text turns' own spread (p95 - p50): {pct(ms, 0.95) - statistics.median(ms):.1f} ms; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
