"""Microsoft Teams: activity to reply request, and the CPU of checking one activity's token.

The real adapter (its messaging endpoint, PyJWT) and the real gateway in this process, against
tests/fakes/teams.py (which signs every activity with its own RS256 key and checks the bot's
token on every reply) and the fake model server in another process, answering at once (so the
figure is the gateway's and the platform path's: the model is out of it).  1,000 DMs from 50
conversations are posted at a steady rate; a message's latency runs from the moment the fake
starts POSTing the activity to the moment it receives the reply's POST.  The adapter's outbound
pacing is raised for the run.  Then the JWT check alone (``ActivityVerifier.check``: signature,
issuer, audience, expiry, serviceUrl) is timed in CPU seconds over 2,000 tokens.

    .venv/bin/python bench/teams.py [--messages 1000] [--chats 50] [--rate 100]
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

from bench.adapters import GATEWAY, UNPACED, inject, start_model, wait_until
from tests.harness import running_gateway


def _pct(ms: list[float], q: float) -> float:
    return ms[min(len(ms) - 1, int(q * len(ms)))]


async def bench(args, home: Path) -> None:
    import jwt

    from adapters.teams import TeamsAdapter
    from adapters.teams.auth import ActivityVerifier
    from adapters.teams.config import MESSAGES_PATH, TeamsConfig
    from tests.fakes.teams import FakeTeams

    proc, model = await start_model()
    try:
        async with FakeTeams() as teams:
            config = TeamsConfig(app_id=teams.app_id, app_password=teams.app_password,
                                 openid_metadata_url=teams.metadata_url, issuer=teams.issuer,
                                 token_url=teams.token_url, service_url=teams.service_url)
            adapter = TeamsAdapter(config, chat_rate=UNPACED, app_rate=1e6)
            async with running_gateway(home, model, adapters={"teams": adapter}, **GATEWAY) as gw:
                await wait_until(lambda: adapter.health().state == "connected", 30, "teams to listen")
                teams.endpoint = f"http://127.0.0.1:{gw.api.bound_port}{MESSAGES_PATH}"
                activities = [teams.activity(conversation=f"a:dm-{i % args.chats}", user=f"29:u{i % args.chats}",
                                             text=f"bench {i}") for i in range(args.messages)]
                posts: set[asyncio.Task] = set()

                async def send_one(i: int) -> None:
                    task = asyncio.create_task(teams.post(activities[i]))
                    posts.add(task)

                injected = await inject(args.messages, args.rate, send_one)
                # the gateway answers the messages that queued up behind a running turn with one reply
                # (its echo names the newest): a message is answered by the first reply in its chat
                # echoing it or a later one
                chat_of = {i: i % args.chats for i in range(args.messages)}
                replies = lambda: [(int(str(c.body["text"]).split("bench ")[1].split(" ")[0]), c.at)  # noqa: E731
                                   for c in teams.calls if c.method == "send" and c.status == 200]
                answered = lambda: {n for n, _ in replies()}  # noqa: E731
                last = {c: max(i for i in range(args.messages) if chat_of[i] == c) for c in range(args.chats)}
                await wait_until(lambda: set(last.values()) <= answered(), 120, "teams replies",
                                 lambda: f"{len(replies())} replies")
                statuses = await asyncio.gather(*posts)
                arrived: dict[int, float] = {}
                for n, at in sorted(replies(), key=lambda r: r[1]):
                    for i in range(n, -1, -args.chats):
                        arrived.setdefault(i, at)
                folded = args.messages - len(replies())
        ms = sorted((arrived[i] - injected[i]) * 1000 for i in range(args.messages))
        print(f"teams: {args.messages} messages, {args.messages - folded} replies ({folded} messages answered together "
              f"with the next in their chat), every activity answered 200: {set(statuses) == {200}}")
        print(f"teams: "
              f"activity to reply request p50 {statistics.median(ms):.1f} ms  p95 {_pct(ms, 0.95):.1f} ms  "
              f"max {ms[-1]:.1f} ms")

        # the token check alone, CPU time, on tokens as the Bot Framework signs them
        async with FakeTeams() as teams:
            import aiohttp

            async with aiohttp.ClientSession() as http:
                verifier = ActivityVerifier(http, metadata_url=teams.metadata_url, issuer=teams.issuer,
                                            app_id=teams.app_id, refresh_seconds=3600)
                await verifier.load()
                activity = teams.activity(conversation="a:dm-1", user="29:u1", text="x")
                tokens = [teams.sign(activity) for _ in range(args.tokens)]
                key = verifier._keys[jwt.get_unverified_header(tokens[0])["kid"]].key
                began = time.process_time()
                for token in tokens:
                    verifier.check(token, key, activity)
                cpu = (time.process_time() - began) / len(tokens)
                began = time.process_time()
                for token in tokens:
                    await verifier.verify(f"Bearer {token}", activity)
                whole = (time.process_time() - began) / len(tokens)
        print(f"teams: JWT validation CPU per activity: {cpu * 1e6:.0f} µs (RS256 signature and claims), "
              f"{whole * 1e6:.0f} µs with the header parse and key look-up ({args.tokens} tokens)")
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100.0, help="activities posted per second")
    parser.add_argument("--tokens", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench(args, Path(tmp) / "home"))


if __name__ == "__main__":
    main()
