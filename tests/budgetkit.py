"""An instance that only sends, as a real process, for tests/test_cluster_budgets.py and bench/ratelimit_shared.py.

    python -m tests.budgetkit telegram --base-url http://127.0.0.1:PORT/bot --chat 42 --count 10 \
        --chat-rate 10 --token-rate 25 [--retry 0.5] [--local]

It builds the real Telegram adapter against ``--base-url`` (a fake Bot API server; it never polls),
shares its rate budgets through the PostgreSQL database at ``SWITCHBOARD_TEST_PG_URL`` (unless
``--local``), prints ``ready``, waits for a line on stdin, sends ``--count`` messages to
``--chat`` one after another, and prints ``done <delivered>``.  The bot token comes from
``SWITCHBOARD_TEST_BOT_TOKEN`` (never the command line, where ``ps`` would show it).

    python -m tests.budgetkit slots --key chat:1 --rate 20 --burst 1 --seconds 3 [--local]

takes slots of one bucket as fast as it is given them for ``--seconds`` after the line on
stdin and prints ``slots <n>`` (the aggregate-rate part of the bench).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time


async def _share(args: argparse.Namespace):
    if args.local:
        return None
    from gateway.ratelimit import share_budgets
    from state.cluster import PgBuckets

    buckets = PgBuckets(os.environ["SWITCHBOARD_TEST_PG_URL"])
    share_budgets(buckets, retry_seconds=args.retry)
    return buckets


async def _go() -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


async def _telegram(args: argparse.Namespace) -> None:
    from adapters.telegram.adapter import TelegramAdapter
    from adapters.telegram.config import TelegramConfig
    from gateway.ratelimit import ChatRate
    from gateway.types import ChatRef

    buckets = await _share(args)
    chat_rate = ChatRate(rate=args.chat_rate, burst=args.chat_burst, min_gap=0.0)
    config = TelegramConfig(token=os.environ["SWITCHBOARD_TEST_BOT_TOKEN"], base_url=args.base_url)
    adapter = TelegramAdapter(config, rate_per_second=args.token_rate, rate_burst=args.token_burst,
                              chat_rate=chat_rate, group_rate=chat_rate, send_attempts=8)
    adapter.gate_polling(lambda: 0.0)  # another instance owns the poller: this one only sends

    async def ignore(_msg) -> None:
        return None

    await adapter.start(ignore)
    try:
        await _go()
        delivered = 0
        for i in range(args.count):
            result = await adapter.send(ChatRef(platform="telegram", chat_id=args.chat), f"{args.name} {i}")
            delivered += result.ok
        print(f"done {delivered}", flush=True)
    finally:
        await adapter.stop()
        if buckets is not None:
            await buckets.close()


async def _slots(args: argparse.Namespace) -> None:
    from gateway.ratelimit import ChatRate, chat_budget_for

    buckets = await _share(args)
    budget = chat_budget_for("bench", "token", args.key, ChatRate(rate=args.rate, burst=args.burst, min_gap=0.0))
    await _go()
    taken = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        await budget.acquire()
        taken += 1
    print(f"slots {taken}", flush=True)
    if buckets is not None:
        await buckets.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.budgetkit")
    roles = parser.add_subparsers(dest="role", required=True)
    telegram = roles.add_parser("telegram")
    telegram.add_argument("--base-url", required=True)
    telegram.add_argument("--chat", required=True)
    telegram.add_argument("--count", type=int, required=True)
    telegram.add_argument("--name", default="instance")
    telegram.add_argument("--chat-rate", type=float, default=10.0)
    telegram.add_argument("--chat-burst", type=int, default=2)
    telegram.add_argument("--token-rate", type=float, default=25.0)
    telegram.add_argument("--token-burst", type=int, default=2)
    slots = roles.add_parser("slots")
    slots.add_argument("--key", required=True)
    slots.add_argument("--rate", type=float, required=True)
    slots.add_argument("--burst", type=int, default=1)
    slots.add_argument("--seconds", type=float, required=True)
    for role in (telegram, slots):
        role.add_argument("--retry", type=float, default=10.0, help="seconds before asking a store that failed again")
        role.add_argument("--local", action="store_true", help="this process's own buckets only (no store)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("gateway.ratelimit").setLevel(logging.INFO)  # "the store is back" too
    asyncio.run(_telegram(args) if args.role == "telegram" else _slots(args))


if __name__ == "__main__":
    main()
