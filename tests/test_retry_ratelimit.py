import asyncio
import time

import pytest

from gateway.ratelimit import RateLimiter, limiter_for
from gateway.retry import Backoff, retry_async, supervise, supervised_failures


class Flaky(Exception):
    def __init__(self, retry_after=0.0):
        self.retry_after = retry_after


async def test_retries_until_success_and_honours_the_servers_wait():
    waits = []
    calls = iter([Flaky(retry_after=7.0), Flaky(), "done"])

    async def call():
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    async def fake_sleep(s):
        waits.append(s)

    result = await retry_async(call, classify=lambda e: e.retry_after if isinstance(e, Flaky) else None,
                               backoff=Backoff(base=0.1, cap=1.0), sleep=fake_sleep)
    assert result == "done"
    assert waits[0] >= 7.0 and 0.05 <= waits[1] <= 0.2


async def test_gives_up_on_errors_classified_fatal():
    async def call():
        raise ValueError("bad request")

    with pytest.raises(ValueError):
        await retry_async(call, classify=lambda e: None)


async def test_gives_up_when_the_total_time_would_be_exceeded():
    attempts = 0

    async def call():
        nonlocal attempts
        attempts += 1
        raise Flaky(retry_after=60.0)

    with pytest.raises(Flaky):
        await retry_async(call, classify=lambda e: e.retry_after, total_seconds=5.0, max_attempts=10)
    assert attempts == 1


async def test_supervise_runs_again_after_each_failure_until_it_returns():
    runs, failures, waits = [], [], []

    async def run():
        runs.append(len(runs))
        if len(runs) < 3:
            raise OSError(f"refused {len(runs)}")

    async def fake_sleep(s):
        waits.append(s)

    before = supervised_failures().get("adapter", 0)
    await supervise(run, name="adapter:test", backoff=Backoff(base=1.0, cap=60.0), sleep=fake_sleep,
                    on_failure=lambda n, exc, wait: failures.append((n, str(exc))))
    assert runs == [0, 1, 2]
    assert failures == [(1, "refused 1"), (2, "refused 2")]
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0
    assert supervised_failures()["adapter"] == before + 2


async def test_supervise_starts_the_backoff_again_after_a_run_that_lasted():
    lasted = iter([0.0, 0.0, 0.2, 0.0])  # how long each run serves before it fails
    waits = []

    async def run():
        try:
            await asyncio.sleep(next(lasted))
        except StopIteration:
            return
        raise OSError("dropped")

    async def fake_sleep(s):
        waits.append(s)

    await supervise(run, name="mcp:test", backoff=Backoff(base=1.0, factor=10.0, cap=1000.0), sleep=fake_sleep,
                    on_failure=lambda n, exc, wait: None, healthy_seconds=0.1)
    ceilings = [1.0, 10.0, 1.0, 10.0]  # the third run served long enough: its wait is the first again
    assert [c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)] == [True] * 4


async def test_supervise_stops_cleanly_when_cancelled_while_waiting(caplog):
    waiting = asyncio.Event()

    async def run():
        raise OSError("down")

    async def slow_sleep(s):
        waiting.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(supervise(run, name="standby:x", sleep=slow_sleep))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "standby:x failed (1 in a row): down" in caplog.text


async def test_pause_holds_every_sender_of_the_token():
    limiter = RateLimiter(rate=1000, burst=10)
    limiter.pause(0.2)
    started = time.monotonic()
    await asyncio.gather(limiter.acquire(), limiter.acquire())
    assert time.monotonic() - started >= 0.19


async def test_one_limiter_per_token():
    a = limiter_for("telegram", "123:abc", rate=30, burst=30)
    assert limiter_for("telegram", "123:abc", rate=30, burst=30) is a
    assert limiter_for("telegram", "456:def", rate=30, burst=30) is not a
