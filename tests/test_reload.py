"""SIGHUP re-reads the config: a platform turned on starts, restart-only keys are named, a bad file changes nothing."""

import asyncio
import datetime as dt
import json
import re
import signal
import time

import aiohttp
import yaml

import state
from gateway.config import config_from_dict
from gateway.runtime.reload import needs_restart
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, merge
from tests.test_daemon_process import SWITCHBOARD, NotifySocket, start_daemon


class LogReader:
    def __init__(self, stream):
        self.stream = stream
        self.lines: list[str] = []

    async def wait_for(self, needle: str, timeout: float = 20.0, *, start: int = 0) -> str:
        """The first line from the ``start``-th on that holds ``needle``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for line in self.lines[start:]:
            if needle in line:
                return line
        while loop.time() < deadline:
            try:
                raw = await asyncio.wait_for(self.stream.readline(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            if not raw:
                break
            line = raw.decode()
            self.lines.append(line)
            if needle in line:
                return line
        raise AssertionError(f"{needle!r} not logged; got:\n{''.join(self.lines)}")


def test_only_restart_keys_are_reported():
    old = config_from_dict({"home": "/tmp/h", "api": {"port": 1}})
    new = config_from_dict({"home": "/tmp/h", "api": {"port": 2}, "auth": {"allow_all": True},
                            "sessions": {"reset": {"mode": "none"}}})
    assert needs_restart(old, new) == ["api.port"]


async def test_sighup_starts_a_platform_and_names_keys_needing_a_restart(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        base = {"home": str(tmp_path / "home"), "model": {"base_url": model.base_url, "name": "fake-model"},
                "api": {"port": 0}, "logging": {"format": "json"}}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(base))
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path)})
        logs = LogReader(proc.stderr)
        try:
            await notify.wait_for(lambda line: line == "READY=1")
            assert tg.calls("getMe") == []

            config.write_text("model: [this is not valid\n")
            proc.send_signal(signal.SIGHUP)
            await logs.wait_for("config reload refused")

            config.write_text(yaml.safe_dump({**base, "api": {"port": 0, "host": "127.0.0.1", "token": "new-token-123"},
                                              "platforms": {"telegram": {"token": tg.token, "base_url": tg.base_url}}}))
            proc.send_signal(signal.SIGHUP)
            await tg.wait_for_calls("getUpdates", timeout=20)
            line = await logs.wait_for("need a restart to apply")
            assert "api.token" in json.loads(line)["msg"]
            await notify.wait_for(lambda line: line == "RELOADING=1")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0


# -- one live section at a time, changed through SIGHUP on a running daemon ------------------

ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
EVE = FakeTelegram.user(666, "Eve")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team")


class Daemon:
    """``switchboard run`` on a config file the test rewrites, with its logs, notifications and API."""

    def __init__(self, tmp_path, base: dict):
        self.tmp_path = tmp_path
        self.base = base
        self.config = tmp_path / "config.yaml"
        self.reloads = 0

    async def __aenter__(self):
        self.write({})
        self.notify = NotifySocket(self.tmp_path / "notify.sock")
        self.proc = await start_daemon(self.config, {"NOTIFY_SOCKET": str(self.notify.path)})
        self.logs = LogReader(self.proc.stderr)
        status = await self.notify.wait_for(lambda line: line.startswith("STATUS=serving"))
        self.port = int(re.search(r"API on 127\.0\.0\.1:(\d+)", status).group(1))
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc):
        await self.http.close()
        self.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.proc.wait(), 30) == 0

    def write(self, extra: dict) -> None:
        self.config.write_text(yaml.safe_dump(merge(self.base, extra)))

    async def reload(self, extra: dict, expect: str = "config reloaded") -> str:
        """Rewrite the config as ``base`` + ``extra``, send SIGHUP, return this reload's log message."""
        self.write(extra)
        seen = len(self.logs.lines)
        self.proc.send_signal(signal.SIGHUP)
        line = await self.logs.wait_for("config reload", start=seen)
        msg = json.loads(line)["msg"]
        assert expect in msg, msg
        return msg

    async def health(self) -> dict:
        async with self.http.get(f"http://127.0.0.1:{self.port}/healthz") as r:
            return await r.json()

    async def say(self, key: str, text: str) -> str:
        async with self.http.post(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                  json={"messages": [{"role": "user", "content": text}]},
                                  headers={"X-Session-Key": key}) as r:
            return (await r.json())["choices"][0]["message"]["content"]


def _base(tmp_path, model, **extra) -> dict:
    return merge({"home": str(tmp_path / "home"), "model": {"base_url": model.base_url, "name": "fake-model"},
                  "api": {"port": 0}, "logging": {"format": "json"}}, extra)


async def test_sighup_arms_a_new_cron_job_and_never_runs_one_twice_or_loses_its_next_run(tmp_path):
    hourly = {"id": "brief", "schedule": "every 1h", "prompt": "the hourly brief", "deliver": "local"}
    async with FakeModel() as model, Daemon(tmp_path, _base(tmp_path, model)) as daemon:
        assert (await daemon.health())["cron"] == {"jobs_armed": 0, "next_run_at": None}

        before = time.time()
        msg = await daemon.reload({"cron": {"jobs": [hourly]}})
        assert "applied cron (added brief)" in msg
        cron = (await daemon.health())["cron"]
        assert cron["jobs_armed"] == 1
        assert before + 3600 - 1 <= cron["next_run_at"] <= time.time() + 3600 + 1
        brief_next = cron["next_run_at"]

        soon_at = dt.datetime.fromtimestamp(time.time() + 2, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        soon = {"id": "soon", "schedule": soon_at, "prompt": "the one-shot job", "deliver": "local"}
        await daemon.reload({"cron": {"jobs": [hourly, soon]}}, expect="applied cron (added soon)")
        await model.wait_for_requests(1, timeout=20)
        await eventually(lambda: _finished_runs(tmp_path, "soon"), timeout=20, what="the one-shot run recorded")
        await daemon.reload({"cron": {"jobs": [hourly, soon]}, "auth": {"allow_all": True}}, expect="applied auth")
        cron = (await daemon.health())["cron"]
        # the one-shot ran once and stays done; the hourly job kept its time through three reloads
        assert cron == {"jobs_armed": 1, "next_run_at": brief_next}
        assert [r["status"] for r in _finished_runs(tmp_path, "soon")] == ["ok"]
        assert [r.messages[-1]["content"] for r in model.requests] == ["the one-shot job"]


async def test_a_reload_is_announced_to_systemd_and_a_bad_one_changes_nothing(tmp_path):
    hourly = {"id": "brief", "schedule": "every 1h", "prompt": "the hourly brief", "deliver": "local"}
    async with FakeModel() as model, Daemon(tmp_path, _base(tmp_path, model)) as daemon:
        await daemon.reload({"cron": {"jobs": [hourly]}})
        armed = (await daemon.health())["cron"]
        msg = await daemon.reload({"cron": {"jobs": [{**hourly, "schedule": "every 0m"}]}},
                                  expect="config reload refused, the running config stays in force")
        assert "cron.jobs.0.schedule" in msg
        assert (await daemon.health())["cron"] == armed
        lines = daemon.notify.received
        await daemon.notify.wait_for(lambda line: line == "READY=1" and lines.count("READY=1") == 3)
    reloading = [i for i, line in enumerate(lines) if line == "RELOADING=1"]
    assert len(reloading) == 2  # one per SIGHUP, the refused one too, each followed by its READY=1
    for i in reloading:
        stamp = lines[i + 1]
        assert stamp.startswith("MONOTONIC_USEC=")
        assert abs(int(stamp.split("=")[1]) - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 60e6
        assert "READY=1" in lines[i + 1:]


async def test_sighup_with_a_new_allowlist_lets_a_stranger_in_without_restarting_telegram(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        base = _base(tmp_path, model, platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                     auth={"allowed_users": ["telegram:111"]})
        async with Daemon(tmp_path, base) as daemon:
            tg.dm(EVE, "hello?")
            [refused] = await tg.wait_for_sent(1, timeout=20)
            assert "switchboard pairing approve telegram " in refused.visible_text
            connects = len(tg.calls("getMe"))

            msg = await daemon.reload({"auth": {"allowed_users": ["telegram:111", "telegram:666"]}})
            assert msg.startswith("config reloaded: applied auth") and "platforms" not in msg
            tg.dm(EVE, "hello again")
            answered = (await tg.wait_for_sent(2, timeout=20))[1]
            assert (answered.chat_id, answered.visible_text.split(" | ")[0]) == (666, "echo: hello again")
            assert len(tg.calls("getMe")) == connects  # the adapter was not restarted


async def test_sighup_with_shared_group_sessions_routes_new_group_messages_together(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        base = _base(tmp_path, model, platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                     auth={"allowed_users": ["telegram:111", "telegram:222"]})
        async with Daemon(tmp_path, base) as daemon:
            tg.in_group(TEAM, ANN, "@switchboard_bot hello from Ann")
            await tg.wait_for_sent(1, timeout=20)
            await daemon.reload({"sessions": {"group_sessions_per_user": False}}, expect="applied sessions")
            tg.in_group(TEAM, BOB, "@switchboard_bot hello from Bob")
            await tg.wait_for_sent(2, timeout=20)
            tg.in_group(TEAM, ANN, "@switchboard_bot and Ann again")
            sent = await tg.wait_for_sent(3, timeout=20)
    assert "turns: 1 | first: hello from Ann" in sent[0].visible_text
    assert "turns: 1 | first: hello from Bob" in sent[1].visible_text
    # one session for the whole group from the reload on: Ann continues Bob's conversation
    assert "echo: and Ann again | turns: 2 | first: hello from Bob" in sent[2].visible_text


async def test_sighup_turns_a_platform_on_and_off_and_healthz_shows_it(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        async with Daemon(tmp_path, _base(tmp_path, model)) as daemon:
            assert (await daemon.health())["platforms"]["telegram"]["state"] == "disabled"
            msg = await daemon.reload({"platforms": {"telegram": {"token": tg.token, "base_url": tg.base_url}}})
            assert "applied platforms (restarted telegram)" in msg
            await _wait_health(daemon, lambda h: h["platforms"]["telegram"]["state"] == "connected")
            await daemon.reload({"platforms": {"telegram": {"enabled": False, "token": tg.token,
                                                            "base_url": tg.base_url}}},
                                expect="applied platforms (restarted telegram)")
            health = await daemon.health()
    assert health["platforms"]["telegram"]["state"] == "disabled"
    assert health["status"] == "ok"


def _finished_runs(tmp_path, job_id: str) -> list[dict]:
    with state.SessionDB(tmp_path / "home" / "state.db") as db:
        return [r for r in db.cron.list_runs(job_id) if r["status"] != "running"]


async def _wait_health(daemon: Daemon, predicate, timeout: float = 20.0) -> dict:
    last = {}

    async def matched() -> dict | None:
        last["health"] = health = await daemon.health()
        return health if predicate(health) else None

    return await eventually(matched, timeout, lambda: f"/healthz to match; last: {last.get('health')}", every=0.05)


async def test_a_reload_that_fails_while_applying_puts_the_running_config_back(tmp_path):
    hourly = {"id": "brief", "schedule": "every 1h", "prompt": "the hourly brief", "deliver": "local"}
    async with FakeModel() as model, FakeTelegram() as tg:
        async with Daemon(tmp_path, _base(tmp_path, model, cron={"jobs": [hourly]})) as daemon:
            add = await asyncio.create_subprocess_exec(
                SWITCHBOARD, "cron", "add", "Clash", "--id", "clash", "-s", "every 2h", "-p", "cli job",
                "--config", str(daemon.config), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert await add.wait() == 0, (await add.stderr.read()).decode()
            before = await _wait_health(daemon, lambda h: h["cron"]["jobs_armed"] == 2)

            # telegram on, and a config job whose id the CLI job already has: the telegram part is
            # applied first, then storing the jobs fails, so telegram must be turned off again
            clash = {"id": "clash", "schedule": "every 3h", "prompt": "config job", "deliver": "local"}
            msg = await daemon.reload(
                {"cron": {"jobs": [hourly, clash]}, "platforms": {"telegram": {"token": tg.token, "base_url": tg.base_url}}},
                expect="config reload failed while applying it, the running config was put back")
            assert "'switchboard cron remove clash'" in msg
            after = await daemon.health()
    assert after["platforms"]["telegram"]["state"] == "disabled"
    assert after["cron"] == before["cron"]


async def test_sighup_adds_removes_and_restarts_changed_tool_servers_and_leaves_the_rest_running(tmp_path):
    from tests.fakes.model_server import Reply, ToolCall
    from tests.test_mcp_tools import echo_server

    def servers(greeting: str, *names: str) -> dict:
        return {"tools": {"mcp_servers": {
            name: echo_server(allow=[f"{name}__*"], deny=[], env={"PYTHONCOERCECLOCALE": "0", "GREETING": greeting})
            for name in names}}}

    def tool_result(request) -> str:
        return [m["content"] for m in request.messages if m.get("role") == "tool"][-1]

    async with FakeModel() as model:
        model.script(ToolCall("keep__pid", {}), Reply("before"),
                     ToolCall("keep__pid", {}), Reply("after"),
                     ToolCall("changed__environment", {}), Reply("env"))
        async with Daemon(tmp_path, _base(tmp_path, model, **servers("one", "keep", "changed", "gone"))) as daemon:
            await _wait_health(daemon, lambda h: all(s["state"] == "ready" for s in h["tool_servers"].values()))
            await daemon.say("ann", "your pid?")
            pid_before = tool_result(model.requests[-1])

            del daemon.base["tools"]["mcp_servers"]["gone"]  # the file is written as base + what reload() adds
            new = servers("one", "added")
            new["tools"]["mcp_servers"]["changed"] = servers("two", "changed")["tools"]["mcp_servers"]["changed"]
            msg = await daemon.reload(new)
            assert "applied tools (added added; restarted changed; removed gone)" in msg, msg
            health = await _wait_health(daemon, lambda h: set(h["tool_servers"]) == {"keep", "changed", "added"}
                                        and all(s["state"] == "ready" for s in h["tool_servers"].values()))
            shown = await daemon.say("ann", "/tools")
            await daemon.say("ann", "your pid again?")
            pid_after = tool_result(model.requests[-1])
            await daemon.say("ann", "your environment?")
            env = json.loads(tool_result(model.requests[-1]))
    assert health["status"] == "ok"
    assert pid_after == pid_before  # an unchanged server was left running
    assert env["GREETING"] == "two"  # the changed one runs with its new settings
    assert "- added__echo: Say the text back." in shown.splitlines()
    assert "gone__echo" not in shown
