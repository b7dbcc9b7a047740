"""`make test-fast` leaves out what tests/marks.py finds slow: a test that starts a process, runs on
PostgreSQL or drives chromium, wherever in the helpers of tests/ the process is started."""

from __future__ import annotations

import subprocess
import sys

from tests.crashkit import Daemon
from tests.harness import eventually
from tests.marks import _uses


async def _starts_a_daemon(tmp_path) -> None:  # the process is started two calls down, in crashkit
    daemon = Daemon(tmp_path, {})
    await daemon.start()


def _runs_python() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _on_its_own_cluster():
    from tests.pgserver import started_or_skip

    yield from started_or_skip()


async def _in_process() -> None:
    await eventually(lambda: True)


def _drives_chromium():
    import playwright.async_api

    return playwright.async_api.async_playwright()


# In a dict, which the search does not look into: this test itself starts nothing and stays fast.
EXAMPLES = {"daemon": _starts_a_daemon, "python": _runs_python, "cluster": _on_its_own_cluster,
            "chromium": _drives_chromium, "in-process": _in_process}


def test_what_a_test_uses_is_found_through_the_helpers_it_calls(request):
    assert _uses(EXAMPLES["daemon"]) == {"processes"}
    assert _uses(EXAMPLES["python"]) == {"processes"}
    assert "postgresql" in _uses(EXAMPLES["cluster"])
    assert _uses(EXAMPLES["chromium"]) == {"browser"}
    assert _uses(EXAMPLES["in-process"]) == set()
    assert request.node.get_closest_marker("slow") is None


def test_an_in_process_test_is_in_the_fast_loop(request, home):
    assert request.node.get_closest_marker("slow") is None


def test_the_postgresql_half_of_a_store_test_is_slow_and_the_sqlite_half_is_not(request, backend, store):
    marks = {name for name in ("slow", "postgresql") if request.node.get_closest_marker(name)}
    assert marks == ({"slow", "postgresql"} if backend == "postgresql" else set())
