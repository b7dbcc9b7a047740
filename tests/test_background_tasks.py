"""No background task dies silently: a failure is logged with its traceback and counted in /metrics."""

import asyncio
import logging

import aiohttp

from gateway.retry import Backoff, supervise
from gateway.tasks import spawn
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, eventually, running_gateway


async def _metrics(gw) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/metrics") as r:
            return await r.text()


def _failures(metrics: str, kind: str) -> float:
    prefix = f'switchboard_background_task_failures_total{{task="{kind}"}} '
    return next((float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix)), 0.0)


async def test_a_memory_flush_that_fails_on_disk_is_logged_with_its_traceback_and_counted(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    async with FakeModel() as model, running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("u", "my cat is called Tom")
        await api.say("u", "and my dog is Rex")
        before = _failures(await _metrics(gw), "memory-flush")
        # the memory folder is now a file: the keep-what-matters turn after /new cannot read it
        memory = tmp_path / "memory"
        if memory.exists():
            memory.rmdir()
        memory.write_text("not a folder")
        assert (await api.say("u", "/new")).startswith("Started a new session.")
        await api.close()
        record = await eventually(
            lambda: next((r for r in caplog.records if "background task memory-flush:" in r.getMessage()), None),
            timeout=10, what="the failed flush logged")
        metrics = await _metrics(gw)
    assert "NotADirectoryError" in record.getMessage()
    assert "Traceback (most recent call last)" in caplog.text and "memory_flush_turn" in caplog.text
    assert _failures(metrics, "memory-flush") == before + 1


async def test_a_cancelled_task_is_not_a_failure_and_a_raising_one_is_named(tmp_path, caplog):
    caplog.set_level(logging.ERROR)

    async def forever():
        await asyncio.Event().wait()

    async def boom():
        raise RuntimeError("the disk is on fire")

    async with FakeModel() as model, running_gateway(tmp_path, model) as gw:
        quiet = spawn(forever(), name="sleeper:1")
        await asyncio.sleep(0)
        quiet.cancel()
        await asyncio.gather(quiet, return_exceptions=True)
        loud = spawn(boom(), name="exploder:7")
        await asyncio.gather(loud, return_exceptions=True)
        await eventually(lambda: "exploder:7" in caplog.text, what="the failure logged")
        metrics = await _metrics(gw)
    assert _failures(metrics, "sleeper") == 0
    assert _failures(metrics, "exploder") == 1
    assert "background task exploder:7 failed: RuntimeError: the disk is on fire" in caplog.text
    assert "sleeper" not in caplog.text


async def test_a_kept_running_loop_that_fails_and_restarts_is_counted_in_metrics(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    runs = []

    async def flaky():
        runs.append(1)
        if len(runs) < 3:
            raise ConnectionError("the server went away")

    async with FakeModel() as model, running_gateway(tmp_path, model) as gw:
        before = await _metrics(gw)
        await supervise(flaky, name="test-loop:one", backoff=Backoff(base=0.01, cap=0.01))
        after = await _metrics(gw)
    prefix = 'switchboard_supervised_restarts_total{loop="test-loop"} '
    assert prefix not in before
    assert f"{prefix}2.0" in after.splitlines(), [line for line in after.splitlines() if "supervised" in line]
    assert len(runs) == 3
