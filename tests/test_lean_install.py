"""`make run` installs the runtime alone: the daemon starts without the test extra or the optional extras."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gateway.cli.main import main as cli

ROOT = Path(__file__).resolve().parent.parent

# What the runtime must not need: the postgresql and otel extras and the test tools.  (The otel extra
# is the SDK and its exporter: opentelemetry-api itself comes with the mcp SDK, a runtime dependency.)
NOT_INSTALLED = ("psycopg", "psycopg_pool", "opentelemetry.sdk", "opentelemetry.exporter", "pytest", "hypothesis",
                 "matplotlib", "playwright",
                 "langchain_openai", "mypy", "ruff")


def test_the_daemon_and_every_command_import_without_the_extras() -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in NOT_INSTALLED)
    code = (f"import sys; {blocked}\n"
            "import gateway.runtime.daemon, gateway.runtime.assemble, gateway.cli.main, gateway.cli.doctor\n"
            "from gateway.cli.main import main\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _rule(makefile: str, target: str) -> str:
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, f"no {target} rule in the Makefile"
    return match.group(1) + "\n" + match.group(2)


def test_make_run_installs_the_runtime_and_make_test_the_test_extra() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "$(RUNTIME)" in _rule(makefile, "run") and "$(STAMP)" not in _rule(makefile, "run")
    runtime = _rule(makefile, "$(RUNTIME)")
    assert "pip install --quiet -e .\n" in runtime and "[test]" not in runtime
    assert "-e '.[test]'" in _rule(makefile, "$(STAMP)")
    assert "$(STAMP)" in _rule(makefile, "check")  # make test runs check first: CI installs the test extra


def test_config_extras_names_what_a_postgresql_store_and_traces_need(tmp_path: Path) -> None:
    from gateway.cli.config import needed_extras
    from gateway.config import load_config

    config = tmp_path / "config.yaml"
    config.write_text("store:\n  url: postgresql://sb@127.0.0.1:5432/sb\n")
    cfg = load_config(config)
    code = ("import sys; sys.modules['psycopg'] = None; sys.modules['opentelemetry.sdk'] = None\n"
            "from gateway.cli.config import needed_extras; from gateway.config import load_config\n"
            f"print(','.join(needed_extras(load_config({str(config)!r}), "
            "{'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:4318'})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "postgresql,otel", done.stderr
    assert needed_extras(cfg, {}) == []  # this checkout's venv has the postgresql extra, and no OTEL_* asks for traces
    result = CliRunner().invoke(cli, ["config", "extras", "--config", str(ROOT / "config.example.yaml")], env={})
    assert result.exit_code == 0 and result.output == "\n"


def test_every_platform_whose_extra_brings_a_library_names_it_so_make_run_installs_it() -> None:
    """`make run` installs what `config extras` names; a platform that declares no LIBRARY is never named."""
    import tomllib

    from gateway.config import platform_models

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    for name, model in platform_models().items():
        brings = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["optional-dependencies"].get(name, [])}
        if brings - base:
            assert model.LIBRARY is not None, f"{name}'s extra brings {sorted(brings - base)}: declare its LIBRARY"
            assert importlib.util.find_spec(model.LIBRARY) is not None, f"{name}: {model.LIBRARY} is not what its extra installs"
