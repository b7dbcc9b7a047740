"""kill -9 and restart, again and again, under load: is anything lost or sent twice?

`switchboard run` runs in its own process against the fake Telegram (long polling, in this
process) and the fake model server (another process, answering after --delay).  Users write
DMs at --rate from --chats chats; at a random moment (seeded) the daemon gets SIGKILL and is
started again on the same home, --cycles times.  At each kill half the chats go quiet for
good and fresh ones take over (writing even while the daemon is down), so what a kill leaves
unanswered is answered by the restarted daemon or by no one.  After the last restart every
message gets --settle seconds to be answered.  tests/crashkit.py does the driving and the
counting (its docstring defines each figure).

Printed: messages sent, stored, answered, lost (target 0), duplicated (target <= the sends in
flight at the kills, ideally 0) and the seconds from READY=1 to the first resumed answer (the
first reply to a message written before the kill; target <= 2 s), p50 and max, also counting
only answers from resumed turns (which call the model) rather than stored replies sent again.

    .venv/bin/python bench/chaos.py [--cycles 20] [--rate 50] [--chats 20] [--delay 0.3] [--seed 1]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.crashkit import ChaosRun, Plan, TelegramSide
from tests.fakes.model_server import start_in_process as start_model
from tests.fakes.telegram import FakeTelegram


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=20, help="kill -9 and restart this many times")
    parser.add_argument("--rate", type=float, default=50.0, help="user messages per second, all chats together")
    parser.add_argument("--chats", type=int, default=20, help="chats writing at any moment")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds the fake model takes to answer")
    parser.add_argument("--min-load", type=float, default=1.0, help="a kill comes at least this long after READY=1")
    parser.add_argument("--max-load", type=float, default=3.0, help="... and at most this long")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds every message may take after the last restart")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="also print each restart's figure")
    args = parser.parse_args()
    # the fake's requests that a kill -9 cut off are expected; aiohttp would print each one's traceback
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    plan = Plan(kills=args.cycles, rate=args.rate, chats=args.chats, retire=max(1, args.chats // 2),
                load_seconds=(args.min_load, args.max_load), settle_seconds=args.settle, seed=args.seed)
    model, model_port = await start_model(args.delay)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with FakeTelegram() as tg:
                run = ChaosRun(TelegramSide(tg), Path(tmp), f"http://127.0.0.1:{model_port}/v1", plan)
                outcome = await run.run()
    finally:
        model.terminate()
        await model.wait()
    report(args, outcome)


def report(args, outcome) -> None:
    f = outcome.figures()
    resumed = outcome.resume_seconds()
    turns = outcome.resume_seconds(new_turns_only=True)
    boot = [s.ready - s.spawned for s in outcome.starts]
    print(f"{args.cycles} kill -9 and restart cycles, fake Telegram, {args.rate:g} messages/s from {args.chats} chats, "
          f"model {args.delay * 1000:.0f} ms, seed {args.seed}")
    print(f"  messages sent {f['sent']}, stored {f['stored']} (more than once: {f['stored twice']}), "
          f"answered {f['answered']}, lost {f['lost']} (target 0)")
    print(f"  replies {f['replies']}, duplicated {f['duplicated']} (target <= {f['in flight at the kills']} "
          f"in flight at the kills, ideally 0); showing the model other than the chat's messages once "
          f"each, in order, in one session {f['replies off the conversation']} (target 0)")
    print(f"  at the kills: {f['in flight at the kills']} sends in flight, {f['pending at the kills']} replies "
          f"stored and not confirmed sent, {f['unanswered at the kills']} messages stored and not answered")
    for what, seconds in (("answer", resumed), ("answer from a new turn (a model call)", turns)):
        if seconds:
            print(f"  READY=1 to the first resumed {what}: p50 {statistics.median(seconds):.2f} s, "
                  f"max {max(seconds):.2f} s over {len(seconds)} restarts (target <= 2 s)")
            if args.verbose:
                print(f"    each: {', '.join(f'{s:.2f}' for s in seconds)}")
        else:
            print(f"  READY=1 to the first resumed {what}: no restart had one")
    print(f"  start to READY=1: p50 {statistics.median(boot):.2f} s, max {max(boot):.2f} s")
    for problem in outcome.problems():
        print(f"  problem: {problem}")
    if outcome.problems() and outcome.log_problems:
        print("  warnings and errors the daemon logged:\n" + outcome.log_problems)


if __name__ == "__main__":
    import uvloop  # the daemon's loop (switchboard run)

    uvloop.run(main())
