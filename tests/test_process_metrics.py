"""/metrics shows the process from outside: memory, file descriptors, threads, CPU, event-loop lag, store size."""

import asyncio

import aiohttp

from tests.fakes.model_server import FakeModel
from tests.harness import eventually, running_gateway


async def _metrics(gw) -> dict[str, float]:
    """The scraped samples without labels, by name."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def test_metrics_show_the_process_the_event_loop_lag_and_the_store_size(tmp_path):
    async with FakeModel() as model, running_gateway(tmp_path, model) as gw:
        first = await _metrics(gw)
        assert first["process_resident_memory_bytes"] > 10 * 2**20  # a Python process with aiohttp loaded
        assert first["process_open_fds"] > 3  # stdio, the store, the API's socket
        assert first["process_cpu_seconds_total"] > 0
        assert first["switchboard_threads"] >= 2  # the event loop's and the store's writer
        await asyncio.sleep(1.2)  # the probe wakes every 0.5 s
        later = await _metrics(gw)
        assert later["switchboard_event_loop_lag_seconds_count"] >= first.get(
            "switchboard_event_loop_lag_seconds_count", 0) + 2
        assert 0 <= later["switchboard_event_loop_lag_seconds_sum"] < later["switchboard_event_loop_lag_seconds_count"]

        async def sized():
            samples = await _metrics(gw)
            return samples if "switchboard_store_bytes" in samples else None

        sizes = await eventually(sized, timeout=10, what="the store's size in /metrics")
        assert sizes["switchboard_store_bytes"] >= (tmp_path / "state.db").stat().st_size > 0
        assert sizes["switchboard_store_wal_bytes"] >= 0
        task = gw._loop_lag
    assert task is not None and task.cancelled()  # the probe stops with the gateway, not as a failure
