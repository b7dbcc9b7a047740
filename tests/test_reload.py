"""SIGHUP re-reads the config: a platform turned on starts, restart-only keys are named, a bad file changes nothing."""

import asyncio
import json
import signal

import yaml

from gateway.config import config_from_dict
from gateway.reload import needs_restart
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.test_daemon_process import NotifySocket, start_daemon


class LogReader:
    def __init__(self, stream):
        self.stream = stream
        self.lines: list[str] = []

    async def wait_for(self, needle: str, timeout: float = 20.0) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for line in self.lines:
            if needle in line:
                return line
        while loop.time() < deadline:
            raw = await asyncio.wait_for(self.stream.readline(), deadline - loop.time())
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
            await notify.wait_for(lambda l: l == "READY=1")
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
            await notify.wait_for(lambda l: l == "RELOADING=1")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0
