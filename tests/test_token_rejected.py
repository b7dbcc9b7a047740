"""A platform that rejects its token (Telegram 401, Discord 401/4004, Slack invalid_auth) is not retried:
it shows `failed: the token was rejected` in /healthz and the serving line, and a reload tries again."""

from __future__ import annotations

import asyncio
import re
import signal

import yaml

from gateway.runtime.daemon import Gateway, platform_summary
from gateway.runtime.reload import apply_reload
from tests.crashkit import NotifySocket, start_daemon
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config
from tests.waiting import eventually


async def rejected(gw: Gateway, name: str) -> dict:
    await eventually(lambda: name in gw.rejected_platforms, 20, f"{name} rejected")
    health = gw.health()["platforms"][name]
    task = gw.platforms._starting[name]
    await asyncio.wait_for(asyncio.shield(task), 5)  # the start loop has ended: nothing retries
    return health


async def test_telegram_401_is_not_retried_and_a_reload_with_the_right_token_connects(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        bad = {"telegram": {"token": "999:wrong-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "base_url": tg.base_url}}
        gw = Gateway(gateway_config(tmp_path, model.base_url, platforms=bad), serve_api=False)
        await gw.start()
        try:
            health = await rejected(gw, "telegram")
            assert (health["state"], health["detail"]) == ("failed", "failed: the token was rejected")
            assert "@BotFather" in health["last_error"] and "wrong-token" not in health["last_error"]
            assert platform_summary(gw, "telegram") == "failed: the token was rejected"
            assert len(tg.calls("getMe")) == 1  # asked once, never again
            # a reload with the same config tries again (the token may have been restored); still rejected
            same = gateway_config(tmp_path, model.base_url, platforms=bad)
            await apply_reload(gw, same, lambda cfg: None)
            await eventually(lambda: len(tg.calls("getMe")) == 2, 20, "tried again on reload")
            await rejected(gw, "telegram")
            good = gateway_config(tmp_path, model.base_url,
                                  platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
            await apply_reload(gw, good, lambda cfg: None)
            await eventually(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", 20, "connected")
            assert "telegram" not in gw.rejected_platforms
        finally:
            await gw.stop(grace_seconds=5)


async def test_discord_and_slack_rejections_are_not_retried(tmp_path):
    async with FakeDiscord() as dc, FakeSlack() as sl, FakeModel() as model:
        platforms = {
            "discord": {"token": "wrong.discord.token", "api_base_url": dc.api_base_url, "gateway_url": dc.gateway_url},
            "slack": {"bot_token": "xoxb-wrong", "app_token": sl.app_token, "api_base_url": sl.base_url},
        }
        gw = Gateway(gateway_config(tmp_path, model.base_url, platforms=platforms), serve_api=False)
        await gw.start()
        try:
            for name, fix in (("discord", "Reset Token"), ("slack", "OAuth & Permissions")):
                health = await rejected(gw, name)
                assert health["detail"] == "failed: the token was rejected", health
                assert fix in health["last_error"]
        finally:
            await gw.stop(grace_seconds=5)


async def test_the_serving_line_says_the_token_was_rejected(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        cfg = {"home": str(tmp_path / "home"), "api": {"port": 0},
               "model": {"base_url": model.base_url, "name": "fake-model"},
               "platforms": {"telegram": {"token": "${TELEGRAM_BOT_TOKEN}", "base_url": tg.base_url}}}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(cfg))
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path),
                                           "TELEGRAM_BOT_TOKEN": "999:wrong-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaa"})
        try:
            status = await notify.wait_for(lambda line: line.startswith("STATUS=serving"))
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr = (await proc.stderr.read()).decode()
    assert "telegram: failed: the token was rejected" in status
    assert re.search(r"switchboard is serving \(telegram: failed: the token was rejected", stderr)
    assert "retrying in" not in stderr and "wrong-token" not in stderr
    assert "TELEGRAM_BOT_TOKEN" in stderr  # the log names the variable that holds the token
