"""`switchboard run` as a real subprocess: sd_notify, SIGTERM during a slow turn, one daemon per home."""

import asyncio
import re
import signal
from pathlib import Path

import aiohttp
import yaml

import state
from tests.crashkit import SWITCHBOARD, NotifySocket, start_daemon
from tests.fakes.model_server import FakeModel


def write_config(tmp_path: Path, model_url: str, **extra) -> Path:
    cfg = {
        "home": str(tmp_path / "home"),
        "model": {"base_url": model_url, "name": "fake-model", "api_key": "sk-daemon-test-secret-123456"},
        "api": {"port": 0},
        "shutdown": {"grace_seconds": 10},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_sigterm_during_a_slow_turn_finishes_it_and_exits_cleanly(tmp_path):
    async with FakeModel(delay=1.5) as model:
        config = write_config(tmp_path, model.base_url)
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"})
        try:
            status = await notify.wait_for(lambda line: line.startswith("STATUS=serving"))
            assert "READY=1" in notify.received
            port = int(re.search(r"API on 127\.0\.0\.1:(\d+)", status).group(1))
            await notify.wait_for(lambda line: line == "WATCHDOG=1")

            async with aiohttp.ClientSession() as http:
                request = asyncio.create_task(http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "take your time"}]},
                    headers={"X-Session-Key": "slow"},
                ))
                await model.wait_for_requests(1)
                proc.send_signal(signal.SIGTERM)
                response = await request
                body = await response.json()
            assert body["choices"][0]["message"]["content"] == "echo: take your time | turns: 1 | first: take your time"
            await notify.wait_for(lambda line: line == "STOPPING=1")
            code = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert "sk-daemon-test-secret-123456" not in stderr  # secrets never reach the logs
    with state.SessionDB(tmp_path / "home" / "state.db") as db:
        sid = db.routes.get("agent:main:api:dm:slow")
        assert [m.role for m in db.messages.get(sid)] == ["user", "assistant"]


async def test_a_second_daemon_on_the_same_home_refuses_to_start(tmp_path):
    async with FakeModel() as model:
        config = write_config(tmp_path, model.base_url)
        notify = NotifySocket(tmp_path / "notify.sock")
        first = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path)})
        try:
            await notify.wait_for(lambda line: line == "READY=1")
            second = await start_daemon(config, {})
            code = await asyncio.wait_for(second.wait(), 30)
            err = (await second.stderr.read()).decode()
            assert code != 0
            assert "already running" in err.lower() or "another" in err.lower()
        finally:
            first.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(first.wait(), 30) == 0


async def test_a_bad_config_exits_78_naming_the_key(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("sessions:\n  reset:\n    mode: sometimes\n")
    proc = await start_daemon(config, {})
    code = await asyncio.wait_for(proc.wait(), 30)
    err = (await proc.stderr.read()).decode()
    assert code == 78
    assert "sessions.reset.mode" in err and "sometimes" in err


async def test_a_bad_cron_job_is_a_config_error_too(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "api": {"port": 0}, "cron": {"jobs": [
        {"id": "brief", "name": "Briefing", "schedule": "every 0m", "prompt": "hi", "deliver": "local"}]}}))
    for argv in (["config", "check"], ["run"]):
        proc = await asyncio.create_subprocess_exec(SWITCHBOARD, *argv, "--config", str(config),
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        code = await asyncio.wait_for(proc.wait(), 30)
        err = (await proc.stderr.read()).decode()
        assert code == 78, (argv, err)
        assert "cron.jobs.0.schedule" in err
