"""``switchboard cron ...``: in-process for the table-editing commands, the installed command as a
subprocess for ``cron run`` (a second process contending for the job's lease)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import state
from gateway.cli.cron import cron_group
from gateway.cli.main import main
from tests.fakes.model_server import FakeModel, Reply
from tests.fakes.telegram import FakeTelegram
from tests.harness import running_gateway
from tests.test_adapter_telegram import make_adapter
from tests.test_cron_gateway import _delivered, until

SWITCHBOARD = Path(sys.executable).parent / "switchboard"


TELEGRAM_ON = {"telegram": {"token": "123456:not-a-real-telegram-token-0000000"}}


def write_config(tmp_path: Path, model_url: str = "http://127.0.0.1:9/v1", jobs=(), platforms=None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "home": str(tmp_path / "home"),
        "timezone": "Europe/Berlin",
        "model": {"base_url": model_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000", "max_retries": 0},
        "cron": {"jobs": list(jobs)},
        **({"platforms": platforms} if platforms else {}),
    }))
    return path


def cli(config: Path, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, ["cron", *args, "--config", str(config)])
    assert result.exit_code == code, result.output
    return result.output


def test_every_cron_command_has_help():
    for name, command in cron_group.commands.items():
        result = CliRunner().invoke(main, ["cron", name, "--help"])
        assert result.exit_code == 0 and command.help and "--config" in result.output, name


def test_add_list_show_edit_pause_resume_remove(tmp_path):
    config = write_config(tmp_path, jobs=[{"id": "digest", "name": "Digest", "schedule": "0 18 * * 5", "prompt": "Weekly digest"}],
                          platforms=TELEGRAM_ON)
    out = cli(config, "add", "Morning briefing", "-s", "0 8 * * 1-5", "-p", "What is on today?", "-d", "telegram:-100123:7")
    assert out.startswith("Added job morning-briefing (Morning briefing): 0 8 * * 1-5, next run ")
    assert out.rstrip().endswith("(Europe/Berlin); delivers to telegram:-100123:7.")
    assert cli(config, "add", "Morning briefing", "-s", "every 2h", "-p", "x").startswith("Added job morning-briefing-2 ")
    bad = cli(config, "add", "Broken", "-s", "0 8 * * 8", "-p", "x", code=1)
    assert "error: schedule: '0 8 * * 8': the day of week field '8' is wrong" in bad and "'every 30m'" in bad
    assert "sms" in cli(config, "add", "Broken", "-s", "every 1h", "-p", "x", "-d", "sms:1", code=1)
    listing = cli(config, "list").splitlines()
    assert [line.split()[0] for line in listing] == ["ID", "digest", "morning-briefing", "morning-briefing-2"]
    assert listing[1].split()[-1] == "config" and listing[2].split()[-1] == "cli"

    # config jobs are edited in the config file; pause works on every job
    assert "is defined in the config file (cron.jobs); edit it there" in cli(config, "edit", "digest", "-p", "x", code=1)
    assert "remove it there (or pause it)" in cli(config, "remove", "digest", code=1)
    assert cli(config, "pause", "digest") == "Paused job digest.\n"
    assert "paused" in cli(config, "list").splitlines()[1]
    assert cli(config, "resume", "digest").startswith("Resumed job digest: next run ")

    assert cli(config, "edit", "morning-briefing", "--prompt", "Anything new?", "--context", "continue").startswith(
        "Updated job morning-briefing")
    shown = cli(config, "show", "morning-briefing")
    assert "prompt:    Anything new?" in shown and "context:   continue" in shown and "No runs yet." in shown
    assert "nothing to change" in cli(config, "edit", "morning-briefing", code=1)
    assert "'every fortnight'" in cli(config, "edit", "morning-briefing", "-s", "every fortnight", code=1)
    assert cli(config, "remove", "morning-briefing-2") == "Removed job morning-briefing-2.\n"
    assert "no scheduled job has the id 'morning-briefing-2'" in cli(config, "show", "morning-briefing-2", code=1)
    assert "tools:     none" in cli(config, "show", "morning-briefing")
    assert cli(config, "add", "Files", "-s", "every 1h", "-p", "x", "--tools", "files__read_*", "--tools",
               "search__query").startswith("Added job files ")
    assert "tools:     files__read_* search__query" in cli(config, "show", "files")
    assert "is not a glob over <server>__<tool>" in cli(config, "add", "Bad", "-s", "every 1h", "-p", "x",
                                                         "--tools", "read", code=1)
    cli(config, "edit", "files", "--tools", "files__list")
    assert "tools:     files__list" in cli(config, "show", "files")
    cli(config, "edit", "files", "--tools", "")
    assert "tools:     none" in cli(config, "show", "files")
    assert cli(config, "remove", "files") == "Removed job files.\n"
    assert cli(config, "history") == "No runs recorded.\n"
    assert cli(config, "history", "-n", "0") == "No runs shown (-n 0).\n"  # not a claim that there are none
    assert "No runs" not in cli(config, "show", "digest", "--runs", "0")
    refused = CliRunner().invoke(main, ["cron", "history", "-n", "-1", "--config", str(config)])
    assert refused.exit_code == 2 and "is not in the range x>=0" in refused.stderr


async def run_cli(*args: str, timeout: float = 60) -> tuple[int, str]:
    """The installed command in its own process; returns (exit code, stdout)."""
    proc = await asyncio.create_subprocess_exec(
        str(SWITCHBOARD), "cron", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert "sk-test-not-a-secret" not in out.decode() + err.decode()
    return proc.returncode, out.decode()


async def test_cron_run_in_a_second_process_respects_the_lease(tmp_path):
    async with FakeModel() as model:
        model.script(Reply("Three things today."))
        config = write_config(tmp_path, model.base_url,
                              jobs=[{"id": "brief", "name": "Brief", "schedule": "0 8 * * *", "prompt": "Plan?"}])
        code, out = await run_cli("run", "brief", "--config", str(config))
        assert code == 0, out
        assert out.startswith("Run #1 of brief: ok - kept in the store (local)\nSession: ")
        assert out.rstrip().endswith("Three things today.")

        # another process holds the job's lease: the CLI does not run it a second time
        db = state.SessionDB(tmp_path / "home" / "state.db")
        try:
            held = db.cron.begin_run("brief", holder="daemon-on-host:4242:abcd", now=time.time(), lease_seconds=120,
                                     trigger="schedule", scheduled_at=None, deliver="local")
            assert held["status"] == "running"
            code, out = await run_cli("run", "brief", "--config", str(config))
            assert code == 1
            assert "skipped - the previous run was still going (held by daemon-on-host:4242:abcd)" in out
            assert len(model.requests) == 1  # the second process never called the model
            db.cron.finish_run(held["run"]["id"], holder="daemon-on-host:4242:abcd", now=time.time(), status="ok",
                               output="x", delivery="local")
        finally:
            db.close()
        history = cli(config, "history", "brief").splitlines()
        assert [line.split()[0] for line in history] == ["RUN", "3", "2", "1"]
        assert history[1].split()[2] == "manual" and "skipped" in history[1]
        shown = cli(config, "show", "brief")
        assert "Last answer (run #2" in shown and shown.rstrip().endswith("x")  # the newest answer


async def test_a_cli_run_for_a_chat_waits_for_the_daemon_to_deliver(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        job = {"id": "remind", "name": "Reminder", "schedule": "0 9 * * *", "prompt": "Remind me", "deliver": "telegram:111"}
        config = write_config(tmp_path, model.base_url, jobs=[job])
        model.script(Reply("Water the plants."))
        code, out = await run_cli("run", "remind", "--config", str(config))
        assert code == 0, out
        assert out.startswith("Run #1 of remind: delivering - waiting for the daemon to deliver to telegram:111")
        assert tg.sent == []
        async with running_gateway(tmp_path / "home", model, adapters={"telegram": make_adapter(tg)},
                                   cron={"jobs": [job]}, timezone="Europe/Berlin") as gw:
            [sent] = await tg.wait_for_sent(1, timeout=15)
            run = await until(lambda: _delivered(gw, 1), "the delivery recorded")
        assert sent.visible_text == "Reminder\n\nWater the plants."
        assert (run["status"], run["delivery"]) == ("ok", "delivered")
        assert "delivered to telegram:111" in cli(config, "show", "remind")


def test_a_target_on_a_platform_that_is_off_is_refused_by_add_and_edit(tmp_path):
    config = write_config(tmp_path)
    refused = ("error: deliver: telegram is off (platforms.telegram.token is not set), so answers for telegram:123 "
               "could not be delivered; turn it on in the config (platforms.telegram) and restart the daemon, "
               "or deliver to local\n")
    assert cli(config, "add", "Tea", "-s", "every 1h", "-p", "Tea?", "-d", "telegram:123", code=1) == refused
    assert cli(config, "list").startswith("No scheduled jobs.")
    assert cli(config, "add", "Tea", "-s", "every 1h", "-p", "Tea?").startswith("Added job tea ")
    assert cli(config, "edit", "tea", "-d", "telegram:123", code=1) == refused
    assert "deliver:   local" in cli(config, "show", "tea")  # the refused edit changed nothing


def test_config_check_warns_of_a_config_job_that_cannot_deliver(tmp_path):
    config = write_config(tmp_path, jobs=[{"id": "tea", "name": "Tea", "schedule": "every 1h", "prompt": "Tea?",
                                           "deliver": "discord:42"},
                                          {"id": "log", "name": "Log", "schedule": "every 1h", "prompt": "Log?"}])
    result = CliRunner().invoke(main, ["config", "check", "--config", str(config)])
    assert result.exit_code == 0 and result.stdout.startswith(f"{config}: ok")
    assert [line for line in result.stdout.splitlines() if "cron.jobs" in line] == [
        f"  warning: {config}: cron.jobs.0.deliver: discord is off (platforms.discord.token is not set), so answers "
        "for discord:42 could not be delivered; turn it on in the config (platforms.discord) and restart the daemon, "
        "or deliver to local"]


async def test_history_shows_why_a_delivery_failed_for_good(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        job = {"id": "remind", "name": "Reminder", "schedule": "0 9 * * *", "prompt": "Remind me", "deliver": "telegram:404"}
        config = write_config(tmp_path, model.base_url, jobs=[job], platforms=TELEGRAM_ON)
        tg.fail_next("sendMessage", status=400, description="Bad Request: chat not found")
        async with running_gateway(tmp_path / "home", model, adapters={"telegram": make_adapter(tg)},
                                   cron={"jobs": [job]}, timezone="Europe/Berlin") as gw:
            await until(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", "telegram connected")
            await gw.cron.run_job("remind")
    [line] = cli(config, "history").splitlines()[1:]
    assert line.endswith("delivery_failed - delivery failed, not retried: part 1/1 not delivered: "
                         "BadRequest: Chat not found")


@pytest.mark.parametrize("args", [["list"], ["history"]])
def test_commands_work_without_a_config_file(tmp_path, args):
    result = CliRunner().invoke(main, ["cron", *args], env={"SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_CONFIG": None})
    assert result.exit_code == 0 and result.output.startswith("No ")


async def test_a_job_added_from_the_cli_is_run_and_delivered_by_the_daemon_process(tmp_path):
    import os
    import signal

    async with FakeModel() as model, FakeTelegram() as tg:
        config = write_config(tmp_path, model.base_url)
        data = yaml.safe_load(config.read_text())
        data.update(platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}}, api={"port": 0})
        config.write_text(yaml.safe_dump(data))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
        daemon = await asyncio.create_subprocess_exec(
            str(SWITCHBOARD), "run", "--config", str(config), env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            await tg.wait_for_calls("getUpdates", timeout=30)  # the daemon is polling Telegram
            code, out = await run_cli("add", "Tea", "-s", "in 2s", "-p", "Time for tea?", "-d", "telegram:111",
                                      "--config", str(config))
            assert code == 0 and out.startswith("Added job tea (Tea): once at "), out
            [sent] = await tg.wait_for_sent(1, timeout=30)  # picked up within a poll, run at its time
            assert sent.chat_id == 111
            assert sent.visible_text == "Tea\n\necho: Time for tea? | turns: 1 | first: Time for tea?"
        finally:
            daemon.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(daemon.communicate(), 30)
        assert daemon.returncode == 0, err.decode()[-2000:]
        history = cli(config, "history", "tea").splitlines()
        assert len(history) == 2 and history[1].split()[2] == "schedule"
        assert "ok - delivered to telegram:111" in history[1]
        assert "done (one-shot)" in cli(config, "show", "tea")


async def test_json_for_list_show_history_and_cron_run_says_no_context_warning(tmp_path):
    async with FakeModel() as model:
        model.script(Reply("Done."))
        config = write_config(tmp_path, model.base_url,
                              jobs=[{"id": "brief", "name": "Brief", "schedule": "0 8 * * *", "prompt": "Plan?"}])
        proc = await asyncio.create_subprocess_exec(
            str(SWITCHBOARD), "cron", "run", "brief", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "context length" not in err.decode()  # said by config check, doctor and the daemon log instead
    [job] = json.loads(cli(config, "list", "--json"))
    assert (job["id"], job["schedule"], job["paused"], job["source"], job["last_status"]) == (
        "brief", "0 8 * * *", False, "config", "ok")
    shown = json.loads(cli(config, "show", "brief", "--json"))
    assert set(shown) == {"job", "runs"} and shown["job"]["prompt"] == "Plan?"
    assert [(r["id"], r["status"], r["output"]) for r in shown["runs"]] == [(1, "ok", "Done.")]
    history = json.loads(cli(config, "history", "--json"))
    assert history == shown["runs"]
    assert json.loads(cli(config, "history", "brief", "-n", "0", "--json")) == []
