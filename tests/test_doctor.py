"""`switchboard doctor` finds each failure it is built to find, and says how to fix it."""

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

import gateway
import state
from gateway.cli.main import main
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram


def write_config(tmp_path, **cfg):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), **cfg}))
    return path


async def doctor(config):
    # CliRunner is synchronous; run it off the loop so the fake servers keep answering
    result = await asyncio.to_thread(CliRunner().invoke, main, ["doctor", "--config", str(config)],
                                     env={"HTTP_PROXY": "", "HTTPS_PROXY": ""})
    return result.exit_code, result.output


def line(output, name):
    return next(line for line in output.splitlines() if line[2:].startswith(name + ":"))


async def test_everything_healthy(tmp_path):
    async with FakeModel(model_name="fake-model") as model, FakeTelegram() as tg:
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"},
                              platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        (tmp_path / "home").mkdir(mode=0o700)
        state.SessionDB(tmp_path / "home" / "state.db").close()
        code, out = await doctor(config)
    assert code == 0, out
    assert line(out, "model").startswith("✓") and "serves 'fake-model'" in line(out, "model")
    assert line(out, "telegram") == "✓ telegram: token valid (@switchboard_bot)"
    assert line(out, "database integrity").startswith("✓")
    assert line(out, "discord").startswith("– discord: off:")
    assert out.rstrip().endswith("All checks passed.")


async def test_model_missing_or_unreachable(tmp_path):
    async with FakeModel(model_name="other-model") as model:
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"})
        code, out = await doctor(config)
    assert code == 1
    assert line(out, "model") == f"✗ model: {model.base_url} does not serve 'fake-model' (it has: other-model)"
    config = write_config(tmp_path, model={"base_url": "http://127.0.0.1:9/v1", "name": "x"})
    code, out = await doctor(config)
    assert code == 1 and "fix: check model.base_url" in out
    assert line(out, "model") == "✗ model: cannot reach http://127.0.0.1:9/v1: connection refused (nothing listens there)"


async def test_each_fallback_model_is_checked_and_named(tmp_path):
    async with FakeModel(model_name="fake-model") as model, FakeModel(model_name="backup-model") as backup:
        models = {"good": {"base_url": backup.base_url, "name": "backup-model"},
                  "wrong": {"base_url": backup.base_url, "name": "gone-model"}}
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model",
                                               "fallbacks": ["good", "wrong"]}, models=models)
        code, out = await doctor(config)
    assert code == 1
    assert line(out, "model").startswith("✓")
    assert line(out, "fallback good") == f"✓ fallback good: {backup.base_url} serves 'backup-model'"
    assert line(out, "fallback wrong") == \
        f"✗ fallback wrong: {backup.base_url} does not serve 'gone-model' (it has: backup-model)"
    assert "fix: set models.wrong.name to one of backup-model" in out


async def test_a_url_without_v1_is_a_problem_with_the_v1_url_as_the_fix(tmp_path):
    async with FakeModel(model_name="fake-model") as model:
        bare = model.base_url.removesuffix("/v1")  # Ollama's address as people copy it
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"home": str(tmp_path / "home"),
                                          "model": {"base_url": "${SWITCHBOARD_MODEL_URL}", "name": "fake-model"}}))
        result = await asyncio.to_thread(CliRunner().invoke, main, ["doctor", "--config", str(config)],
                                         env={"HTTP_PROXY": "", "SWITCHBOARD_MODEL_URL": bare})
        code, out = result.exit_code, result.output
    assert code == 1, out
    assert line(out, "model") == \
        f"✗ model: {bare}/models answered 404: the OpenAI-compatible API is at {model.base_url}"
    assert f"fix: set model.base_url to {model.base_url} (SWITCHBOARD_MODEL_URL={model.base_url})" in out
    assert "All checks passed" not in out


async def test_a_server_that_is_not_an_openai_api_is_a_problem(tmp_path):
    from aiohttp import web

    app = web.Application()  # answers 404 everywhere, like a web server on the wrong port
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        config = write_config(tmp_path, model={"base_url": f"http://127.0.0.1:{port}/v1", "name": "fake-model"})
        code, out = await doctor(config)
    finally:
        await runner.cleanup()
    assert code == 1
    assert line(out, "model") == (f"✗ model: http://127.0.0.1:{port}/v1/models answered 404: "
                                  "this is not an OpenAI-compatible API's base URL")


async def test_bad_platform_tokens(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg, FakeDiscord() as dc, FakeSlack() as sl:
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"}, platforms={
            "telegram": {"token": "999:wrong-token-aaaaaaaaaaaaaaaaaaaaaaaaaa", "base_url": tg.base_url},
            "discord": {"token": "wrong.discord.token", "api_base_url": dc.api_base_url},
            "slack": {"bot_token": "xoxb-wrong", "app_token": sl.app_token, "api_base_url": sl.base_url},
        })
        code, out = await doctor(config)
    assert code == 1
    for name in ("telegram", "discord", "slack"):
        assert line(out, name).startswith(f"✗ {name}: the token was refused"), out
    assert "wrong-token" not in out and "xoxb-wrong" not in out  # tokens are never printed


async def test_permissions_and_a_corrupt_database(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / "state.db").write_bytes(b"this is not a database" * 100)
    os.chmod(home / "state.db", 0o644)
    async with FakeModel() as model:
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"})
        code, out = await doctor(config)
    assert code == 1
    assert line(out, "home permissions") == f"✗ home permissions: {home} is 0755"
    assert f"fix: chmod 700 {home}" in out and f"fix: chmod 600 {home / 'state.db'}" in out
    assert line(out, "database").startswith("✗ database:") and "not a SQLite database" in line(out, "database")


async def test_a_bad_config_is_reported_and_the_rest_still_checked(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  max_concurrent_calls: many\n")
    code, out = await doctor(config)
    assert code == 1
    assert line(out, "config").startswith("✗ config:") and "model.max_concurrent_calls" in out
    assert "disk:" in out


async def test_json_report_has_one_shape(tmp_path):
    async with FakeModel(model_name="other-model") as model:
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"})
        result = await asyncio.to_thread(CliRunner().invoke, main, ["doctor", "--json", "--config", str(config)],
                                         env={"HTTP_PROXY": "", "HTTPS_PROXY": ""})
    data = json.loads(result.output)
    assert result.exit_code == 1
    assert set(data) == {"ok", "problems", "checks"} and data["ok"] is False and data["problems"] >= 1
    assert all(set(c) == {"name", "ok", "detail", "fix"} for c in data["checks"])
    model_check = next(c for c in data["checks"] if c["name"] == "model")
    assert model_check["ok"] is False and model_check["fix"] == "set model.name to one of other-model"
    assert next(c for c in data["checks"] if c["name"] == "discord")["ok"] is None


def test_without_a_config_file_it_says_where_it_looked(tmp_path):
    home = tmp_path / "empty-home"
    result = CliRunner().invoke(main, ["doctor"], env={"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_CONFIG": ""})
    config_line = line(result.output, "config")
    assert config_line.startswith("✗ config: ") and f"no config file at {home / 'config.yaml'}" in config_line
    assert "looked in $SWITCHBOARD_HOME" in config_line and "given with --config" not in config_line
    assert "fix: fix the key named above" not in result.output
    assert result.output.count("config.example.yaml") == 1  # said once, on the fix line
    assert (f"fix: use the config `make run` uses: --config {EXAMPLE}, or copy it to {home / 'config.yaml'}"
            in result.output)


EXAMPLE = Path(gateway.__file__).resolve().parent.parent / "config.example.yaml"
SWITCHBOARD = Path(sys.executable).parent / "switchboard"


def _quick_start_env(tmp_path, model) -> dict[str, str]:
    """The shell of an operator who ran `make run` with their model server's variables, nothing else set."""
    (tmp_path / "user").mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "user"), "LANG": "C.UTF-8",
            "SWITCHBOARD_MODEL_URL": model.base_url, "SWITCHBOARD_MODEL": "fake-model"}


async def test_after_make_run_doctor_checks_the_config_make_run_used_and_the_model(tmp_path):
    async with FakeModel(model_name="fake-model") as model:
        proc = await asyncio.create_subprocess_exec(
            SWITCHBOARD, "doctor", cwd=EXAMPLE.parent, env=_quick_start_env(tmp_path, model),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = (b.decode() for b in await proc.communicate())
    assert proc.returncode == 0, out + err
    assert line(out, "config") == (
        f"✓ config: {EXAMPLE} is valid (the checkout's example, which `make run` uses: none of --config, "
        "SWITCHBOARD_CONFIG, SWITCHBOARD_HOME is set and there is no ~/.switchboard/config.yaml)")
    assert line(out, "model") == f"✓ model: {model.base_url.rstrip('/')} serves 'fake-model'"


def _readme_next_steps() -> list[str]:
    """The commands of the README's first sh block that runs .venv/bin/switchboard (the quick start's next steps)."""
    readme = (EXAMPLE.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    block = next(b for b in blocks if ".venv/bin/switchboard" in b)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


async def test_the_readmes_next_steps_after_make_run_work_when_pasted(tmp_path):
    steps = _readme_next_steps()
    assert steps[0] == ".venv/bin/switchboard doctor"
    async with FakeModel(model_name="fake-model") as model:
        for step in steps:
            proc = await asyncio.create_subprocess_shell(
                step, cwd=EXAMPLE.parent, env=_quick_start_env(tmp_path, model),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out = (await proc.communicate())[0].decode()
            assert proc.returncode == 0, f"{step}:\n{out}"
            assert "✗" not in out and "error" not in out.lower(), f"{step}:\n{out}"


async def test_a_window_the_models_server_named_is_shown_with_the_line_to_add(tmp_path):
    """The daemon learned a 2,048-token window from the server's context-length error (issue #36):
    ``doctor`` says so, with the config line that makes it permanent."""
    from gateway.windows import learned_windows
    from tests.harness import ApiClient, eventually, running_gateway

    async with FakeModel(model_name="fake-model") as model:
        model.llama_cpp_window = 2048
        async with running_gateway(tmp_path / "home", model, model={"context_length": None}) as gw:
            api = ApiClient(gw)
            answer = await api.say("k", "a pasted log line, again and again. " * 500)
            await api.close()
            await eventually(lambda: learned_windows(tmp_path / "home"), 5, "the learned window noted")
        config = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"})
        code, out = await doctor(config)
        fixed = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model", "context_length": 2048})
        _, after = await doctor(fixed)
    assert answer.startswith("echo: a pasted log line")
    assert code == 1
    assert line(out, "context length").startswith("✗ context length: the model's server said its window is 2,048 "
                                                 "tokens")
    assert "not the 8,192 assumed" in line(out, "context length")
    assert "fix: set model.context_length: 2048 in the config" in out
    assert line(after, "context length") == "✓ context length: 2,048 tokens (model.context_length)"
