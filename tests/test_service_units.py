"""The systemd units: rendering, `switchboard service install|uninstall|status`, systemd-analyze."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import gateway
from gateway.cli.service import service as service_group
from gateway.runtime import lockfile, systemd as service
from gateway.runtime.systemd import ServiceError, plan_install, render_unit

RUN_AS = "daemon"  # exists on Debian, is not root and not the special "nobody"
SECRET = "123456:sekrit-telegram-token"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value given (units repeat keys such as SystemCallFilter=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("agent: main\n")
    return path


def invoke(*args: str):
    return CliRunner().invoke(service_group, list(args), catch_exceptions=False)


# --- rendering -------------------------------------------------------------


def test_system_unit_holds_the_real_paths_and_the_service_contract(tmp_path, config):
    home = tmp_path / "home"
    plan = plan_install("system", config=config, home=home, unit_dir=tmp_path / "units", run_as=RUN_AS)
    unit = parse_unit(plan.unit_text)
    svc = unit["Service"]
    switchboard = service.default_executable()
    assert svc["ExecStart"] == [f"{switchboard} run --config {config}"]
    assert svc["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # `systemctl reload` is SIGHUP
    assert switchboard.parent == Path(os.path.normpath(Path(os.sys.executable).absolute())).parent
    assert svc["User"] == [RUN_AS]
    assert svc["Environment"] == [f"SWITCHBOARD_HOME={home}", "PYTHONUNBUFFERED=1"]
    assert svc["EnvironmentFile"] == [f"{home}/switchboard.env"]
    assert svc["ReadWritePaths"] == [str(home)]
    assert svc["WorkingDirectory"] == [str(home)]
    assert svc["Type"] == ["notify"]
    assert svc["NotifyAccess"] == ["main"]
    assert svc["WatchdogSec"] == ["30"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["78"]
    assert svc["TimeoutStopSec"] == ["45"]  # default grace 30s + 15
    assert svc["UMask"] == ["0077"]
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["MemoryDenyWriteExecute"] == ["yes"]
    assert svc["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert svc["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    assert unit["Unit"]["After"] == ["network-online.target"]
    assert unit["Unit"]["Wants"] == ["network-online.target"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert re.findall(r"@[A-Z_]+@", plan.unit_text) == []  # every placeholder filled


def test_stop_timeout_outlasts_the_configured_grace_period(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("shutdown:\n  grace_seconds: 100\n")
    plan = plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path)
    assert parse_unit(plan.unit_text)["Service"]["TimeoutStopSec"] == ["115"]
    config.write_text("shutdown:\n  grace_seconds: 0\n")
    plan = plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path)
    assert parse_unit(plan.unit_text)["Service"]["TimeoutStopSec"] == ["15"]
    config.write_text("shutdown:\n  grace_seconds: ${GRACE}\n")  # not a number here: the default
    plan = plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path)
    assert parse_unit(plan.unit_text)["Service"]["TimeoutStopSec"] == ["45"]


def test_user_unit_has_no_user_and_targets_the_user_manager(tmp_path, config):
    plan = plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path / "units")
    unit = parse_unit(plan.unit_text)
    assert "User" not in unit["Service"]
    assert unit["Service"]["RestartPreventExitStatus"] == ["78"]
    assert unit["Service"]["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert unit["Install"]["WantedBy"] == ["default.target"]
    assert plan.commands == (
        f"systemctl --user link {tmp_path}/units/switchboard.service",
        "systemctl --user daemon-reload",
        "systemctl --user enable --now switchboard.service",
        f"loginctl enable-linger {getpass.getuser()}",
        "systemctl --user status switchboard.service",
        "journalctl --user -u switchboard.service -f",
    )


def test_commands_for_the_default_system_directory_need_no_link(tmp_path, config):
    plan = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS)
    assert plan.unit_path == Path("/etc/systemd/system/switchboard.service")
    assert plan.commands == (
        "systemctl daemon-reload",
        "systemctl enable --now switchboard.service",
        "systemctl status switchboard.service",
        "journalctl -u switchboard.service -f",
    )


def test_protect_home_hides_home_directories_unless_the_service_needs_one(tmp_path, config):
    # a switchboard script whose interpreter lives outside /home and /root
    script = tmp_path / "venv" / "bin" / "switchboard"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    outside = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script)
    assert parse_unit(outside.unit_text)["Service"]["ProtectHome"] == ["yes"]
    under_home = plan_install("system", config=config, home=Path("/home/alice/sb"), run_as=RUN_AS, executable=script)
    # read-only keeps /home visible; ReadWritePaths= still opens the home for writing
    assert parse_unit(under_home.unit_text)["Service"]["ProtectHome"] == ["read-only"]
    script.write_text("#!/root/.venv/bin/python\n")  # the interpreter itself under /root
    in_root = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script)
    assert parse_unit(in_root.unit_text)["Service"]["ProtectHome"] == ["read-only"]


def test_a_config_pinning_another_home_gets_a_warning(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("home: /srv/elsewhere\n")
    plan = plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path)
    assert any("sets home: /srv/elsewhere" in w and "pass --home /srv/elsewhere" in w for w in plan.warnings)
    config.write_text("home: ${SWITCHBOARD_HOME:-~/.switchboard}\n")  # follows the unit's SWITCHBOARD_HOME
    assert plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path).warnings == ()
    config.write_text(f"home: {tmp_path / 'home'}\n")
    assert plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path).warnings == ()


def test_paths_under_tmp_get_a_warning_about_private_tmp(tmp_path, config):
    plan = plan_install("system", config=config, home=Path("/tmp/sb-home"), run_as=RUN_AS)
    assert any("PrivateTmp=yes" in w and "/tmp/sb-home" in w for w in plan.warnings)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"run_as": "root"}, "must not run as root"),
        ({"run_as": "bad user"}, "not a valid user name"),
        ({"home": Path("/srv/my home")}, "characters a unit file would need escaped"),
        ({"home": Path("/srv/100%")}, "characters a unit file would need escaped"),
        ({"config": Path("/nonexistent/config.yaml")}, "does not exist: write it first"),
        ({"executable": Path("/nonexistent/bin/switchboard")}, "is not an executable switchboard script"),
    ],
)
def test_bad_settings_are_refused_with_what_to_do(tmp_path, config, kwargs, message):
    args = {"config": config, "home": tmp_path / "home", "unit_dir": tmp_path, "run_as": RUN_AS} | kwargs
    with pytest.raises(ServiceError, match=re.escape(message)):
        plan_install("system", **args)
    assert not (tmp_path / "switchboard.service").exists()


def test_missing_user_is_a_warning_with_the_useradd_command(tmp_path, config):
    plan = plan_install("system", config=config, home=tmp_path / "home", run_as="switchboard-nosuchuser")
    assert any("useradd --system" in w and "switchboard-nosuchuser" in w for w in plan.warnings)


@pytest.fixture
def open_dir():
    """A directory every account can enter (pytest's own tmp_path sits in a private one)."""
    path = Path(tempfile.mkdtemp(prefix="switchboard-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_files_the_service_account_cannot_reach_get_a_warning(open_dir):
    tmp_path = open_dir
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # ours; the service account is another user
    script = private / "venv" / "bin" / "switchboard"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text("agent: main\n")
    config.chmod(0o600)
    package = private / "src" / "gateway"  # an editable install's source tree
    package.mkdir(parents=True)
    plan = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script,
                        package_dir=package)
    assert f"user {RUN_AS!r} cannot use {script} (no permission at {private}): install switchboard in a virtual environment" in "\n".join(plan.warnings)
    assert f"user {RUN_AS!r} cannot use {package} (no permission at {private}): install switchboard" in "\n".join(plan.warnings)
    assert f"user {RUN_AS!r} cannot use {config}: let it read the file (chgrp daemon FILE; chmod g+r FILE)" in plan.warnings
    private.chmod(0o755)
    config.chmod(0o644)
    plan = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script,
                        package_dir=package)
    assert [w for w in plan.warnings if "cannot use" in w] == []


def test_another_environments_script_is_judged_by_its_own_paths_not_this_checkout(tmp_path, config):
    """Wherever this checkout lives (a private home directory too), a given script's unit depends only on it."""
    script = tmp_path / "venv" / "bin" / "switchboard"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    plan = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script)
    assert plan.settings.package_dir is None
    assert parse_unit(plan.unit_text)["Service"]["ProtectHome"] == ["yes"]
    checkout = Path("/home/alice/switchboard/gateway")  # an editable install from a home directory
    in_home = plan_install("system", config=config, home=tmp_path / "home", run_as=RUN_AS, executable=script,
                           package_dir=checkout)
    assert parse_unit(in_home.unit_text)["Service"]["ProtectHome"] == ["read-only"]
    assert plan_install("user", config=config, home=tmp_path / "home", unit_dir=tmp_path).settings.package_dir == \
        Path(gateway.__file__).resolve().parent


def test_render_refuses_a_relative_path(tmp_path, config):
    settings = service.UnitSettings(
        scope="user", switchboard=service.default_executable(), config=config,
        home=Path("relative/home"), env_file=tmp_path / "x.env",
    )
    with pytest.raises(ServiceError, match="must be absolute"):
        render_unit(settings)


# --- install / uninstall / status through the CLI ---------------------------


def test_install_writes_the_unit_creates_home_and_private_env_file(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    result = invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 0, result.output
    unit_file = units / "switchboard.service"
    assert unit_file.read_text() == plan_install("user", config=config, home=home, unit_dir=units).unit_text
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    env_file = home / "switchboard.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert env_file.read_text() == (service.SOURCE_TEMPLATE_DIR / "switchboard.env.example").read_text()
    assert result.output.splitlines() == [
        f"wrote: {unit_file}",
        f"created home {home} (mode 0700)",
        f"created {env_file} (mode 0600): put the platform tokens and the model key in it",
        "now run:",
        f"  systemctl --user link {unit_file}",
        "  systemctl --user daemon-reload",
        "  systemctl --user enable --now switchboard.service",
        f"  loginctl enable-linger {getpass.getuser()}",
        "  systemctl --user status switchboard.service",
        "  journalctl --user -u switchboard.service -f",
    ]
    again = invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    assert again.output.splitlines()[:2] == [f"unchanged: {unit_file}", f"secrets: {env_file} (kept as it is, mode 0600)"]


def test_install_tightens_a_readable_env_file_and_never_prints_it(tmp_path, config):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env_file = home / "switchboard.env"
    env_file.write_text(f"TELEGRAM_BOT_TOKEN={SECRET}\n")
    env_file.chmod(0o644)
    result = invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert env_file.read_text() == f"TELEGRAM_BOT_TOKEN={SECRET}\n"  # contents untouched
    assert f"{env_file} was readable by other users; it is now mode 0600" in result.output
    assert "sekrit" not in result.output
    dry = invoke("install", "--user", "--dry-run", "--config", str(config), "--home", str(home), "--unit-dir", str(tmp_path))
    assert "sekrit" not in dry.output


def test_dry_run_prints_the_unit_and_writes_nothing(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    result = invoke(
        "install", "--system", "--dry-run", "--run-as", RUN_AS,
        "--config", str(config), "--home", str(home), "--unit-dir", str(units),
    )
    assert result.exit_code == 0, result.output
    assert f"# {units}/switchboard.service (not written: --dry-run)" in result.output
    assert f"User={RUN_AS}" in result.output
    assert "RestartPreventExitStatus=78" in result.output
    assert f"#   systemctl link {units}/switchboard.service" in result.output
    assert f"# would create {home}/switchboard.env (mode 0600)" in result.output
    assert not units.exists() and not home.exists()


def test_install_refusal_is_one_line_and_exit_1(tmp_path):
    result = invoke("install", "--user", "--config", str(tmp_path / "missing.yaml"), "--home", str(tmp_path / "h"),
                    "--unit-dir", str(tmp_path / "u"))
    assert result.exit_code == 1
    assert result.output.startswith("Error: config file ")
    assert not (tmp_path / "u").exists() and not (tmp_path / "h").exists()


def test_system_install_as_root_gives_the_home_to_the_service_account(tmp_path, config):
    if os.geteuid() != 0:
        pytest.skip("chown to another account needs root; this test runs as an ordinary user")
    home = tmp_path / "home"
    result = invoke("install", "--system", "--run-as", RUN_AS, "--config", str(config), "--home", str(home),
                    "--unit-dir", str(tmp_path / "units"))
    assert result.exit_code == 0, result.output
    import pwd

    assert home.stat().st_uid == pwd.getpwnam(RUN_AS).pw_uid
    assert "now run:" in result.output


def test_uninstall_removes_unit_and_enablement_link_but_keeps_home(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    wants = units / "default.target.wants"
    wants.mkdir()
    (wants / "switchboard.service").symlink_to(units / "switchboard.service")  # what `enable` makes
    result = invoke("uninstall", "--user", "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 0, result.output
    assert not (units / "switchboard.service").exists()
    assert not (wants / "switchboard.service").is_symlink()
    assert (home / "switchboard.env").exists()
    assert "  systemctl --user daemon-reload" in result.output
    assert invoke("uninstall", "--user", "--home", str(home), "--unit-dir", str(units)).output == (
        f"no unit installed at {units}/switchboard.service: nothing to remove\n"
    )


def test_uninstall_is_refused_while_the_daemon_runs(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    with lockfile.acquire(home):
        result = invoke("uninstall", "--user", "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 1
    # this process holds the lock, as `make run` would: not the service, so no systemctl line
    assert f"a daemon started outside systemd (make run, switchboard run) is running on {home}" in result.output
    assert "Ctrl-C in its terminal" in result.output and "disable --now" not in result.output
    assert (units / "switchboard.service").exists()


def test_install_fills_the_env_file_with_the_variables_this_shell_exports(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  base_url: ${SWITCHBOARD_MODEL_URL:-http://127.0.0.1:8000/v1}\n"
                      "  name: ${MY_MODEL_NAME}\n")
    home, units = tmp_path / "home", tmp_path / "units"
    result = CliRunner(env={"SWITCHBOARD_MODEL_URL": "http://127.0.0.1:11434/v1", "MY_MODEL_NAME": "llama3.1:8b"}).invoke(
        service_group, ["install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units)])
    assert result.exit_code == 0, result.output
    text = (home / "switchboard.env").read_text()
    assert "\nSWITCHBOARD_MODEL_URL=http://127.0.0.1:11434/v1\n" in text and "#SWITCHBOARD_MODEL_URL=" not in text
    assert "\nMY_MODEL_NAME=llama3.1:8b\n" in text
    assert f"created {home / 'switchboard.env'} (mode 0600) with MY_MODEL_NAME, SWITCHBOARD_MODEL_URL" in result.output
    assert "llama3.1:8b" not in result.output  # names only, never values


def test_status_and_uninstall_find_a_unit_installed_with_user_and_unit_dir(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    status = invoke("status", "--home", str(home))  # no --user, no --unit-dir
    assert status.output.splitlines()[0] == f"unit: {units / 'switchboard.service'} (installed, not enabled)"
    removed = invoke("uninstall", "--home", str(home))
    assert removed.exit_code == 0 and f"removed {units / 'switchboard.service'}" in removed.output


def test_status_says_what_is_installed_running_and_that_systemd_is_absent(tmp_path, config):
    home, units = tmp_path / "home", tmp_path / "units"
    result = invoke("status", "--user", "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 3
    lines = result.output.splitlines()
    assert lines[0] == f"unit: not installed at {units}/switchboard.service (switchboard service install --user)"
    assert lines[1] == f"daemon: not running on {home}"
    invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    with lockfile.acquire(home):
        result = invoke("status", "--user", "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == f"unit: {units}/switchboard.service (installed, not enabled)"
    assert lines[1] == f"daemon: running on {home} (pid {os.getpid()})"
    if not service.systemd_running():
        assert lines[2].startswith("systemd: not running on this machine (no /run/systemd/system)")


# --- systemd-analyze --------------------------------------------------------


def _analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed: apt-get install systemd")
    return path


def _render_to(tmp_path, scope, config) -> Path:
    plan = plan_install(scope, config=config, home=tmp_path / "home", unit_dir=tmp_path / scope,
                        run_as=RUN_AS if scope == "system" else None)
    service.install(plan)
    return plan.unit_path


def _user_env(tmp_path) -> dict[str, str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}  # --user needs one, even offline


@pytest.mark.parametrize("scope", ["system", "user"])
def test_rendered_units_pass_systemd_analyze_verify(tmp_path, config, scope):
    analyze = _analyze()
    unit = _render_to(tmp_path, scope, config)
    argv = [analyze] + (["--user"] if scope == "user" else []) + ["verify", str(unit)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_user_env(tmp_path))
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_verify_catches_a_broken_unit(tmp_path, config):
    """The check above can fail: a misspelt directive is reported."""
    analyze = _analyze()
    unit = _render_to(tmp_path, "system", config)
    unit.write_text(unit.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "Unknown key 'NoNewPrivilege' in section [Service]" in proc.stderr


def _exposure(analyze: str, unit: Path, env=None, user=False) -> float:
    argv = [analyze] + (["--user"] if user else []) + ["security", "--offline=true", "--no-pager", str(unit)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


@pytest.mark.parametrize("protect_home", ["yes", "read-only"])
def test_system_unit_is_rated_at_most_1_5_by_systemd_analyze_security(tmp_path, config, protect_home):
    analyze = _analyze()
    script = tmp_path / "venv" / "bin" / "switchboard"
    script.parent.mkdir(parents=True)
    # an interpreter outside /home and /root gives ProtectHome=yes; one under /root, read-only
    script.write_text("#!/usr/bin/python3\n" if protect_home == "yes" else "#!/root/venv/bin/python\n")
    script.chmod(0o755)
    plan = plan_install("system", config=config, home=tmp_path / "home", unit_dir=tmp_path / "system",
                        run_as=RUN_AS, executable=script)
    service.install(plan)
    unit = plan.unit_path
    assert parse_unit(unit.read_text())["Service"]["ProtectHome"] == [protect_home]
    assert _exposure(analyze, unit) <= 1.5
    # and the rating does move: without the hardening block the same unit is exposed
    text = unit.read_text()
    bare = text[: text.index("# --- hardening")] + text[text.index("[Install]"):]
    unit.write_text(bare)
    assert _exposure(analyze, unit) > 5.0


def test_switchboard_service_is_mounted_on_the_main_command(tmp_path, config):
    switchboard = Path(os.sys.executable).parent / "switchboard"
    proc = subprocess.run(
        [switchboard, "service", "install", "--user", "--dry-run", "--config", str(config),
         "--home", str(tmp_path / "home"), "--unit-dir", str(tmp_path / "units")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"ExecStart={switchboard} run --config {config}" in proc.stdout
    assert not (tmp_path / "units").exists()


def test_an_installed_wheel_finds_its_unit_templates_outside_the_source_tree(tmp_path, monkeypatch, config):
    prefix = tmp_path / "venv"
    installed = prefix / "share" / "switchboard" / "systemd"
    installed.mkdir(parents=True)
    for name in ("switchboard.service", "switchboard-user.service", "switchboard.env.example"):
        shutil.copy(service.SOURCE_TEMPLATE_DIR / name, installed / name)
    monkeypatch.setattr(service, "SOURCE_TEMPLATE_DIR", tmp_path / "no-checkout" / "systemd")
    monkeypatch.setattr(service.sys, "prefix", str(prefix))
    monkeypatch.setattr(service.sysconfig, "get_path", lambda name: str(prefix))
    assert service.read_template("switchboard.service") == (installed / "switchboard.service").read_text()

    (installed / "switchboard.service").unlink()
    with pytest.raises(ServiceError, match=r"unit template switchboard.service is missing .*reinstall switchboard"):
        service.read_template("switchboard.service")


def test_install_names_only_the_variables_the_env_file_lacks_once_on_stderr(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(
        "home: ${SWITCHBOARD_HOME}\n"  # the unit sets it
        "model:\n  base_url: ${SWITCHBOARD_MODEL_URL:-http://127.0.0.1:8000/v1}\n  api_key: ${MODEL_KEY}\n"
        "  name: ${SWITCHBOARD_MODEL:-default}\n"
        "platforms:\n  telegram:\n    token: ${TELEGRAM_BOT_TOKEN}\n"
        "api:\n  token: \"$${NOT_A_VARIABLE}\"\n"
        "# ${IN_A_COMMENT} is not read\n")
    home, units = tmp_path / "home", tmp_path / "units"
    home.mkdir()
    (home / "switchboard.env").write_text("# secrets\nTELEGRAM_BOT_TOKEN=123:abc\n")
    (home / "switchboard.env").chmod(0o600)
    monkeypatch.delenv("SWITCHBOARD_MODEL_URL", raising=False)
    monkeypatch.setenv("SWITCHBOARD_MODEL", "llama3")  # exported in this shell: the operator uses it
    note = ("note: the config reads MODEL_KEY (no default), SWITCHBOARD_MODEL (set in this shell) from the "
            f"environment, and {home / 'switchboard.env'} does not set them: systemd does not see variables "
            "exported in your shell, so put them there (NAME=value lines)")
    result = invoke("install", "--user", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [note]
    dry = invoke("install", "--user", "--dry-run", "--config", str(config), "--home", str(home), "--unit-dir", str(units))
    assert dry.stderr.splitlines()[-1] == note and dry.stderr.count("note:") == 1
    assert "note" not in dry.stdout

    (home / "switchboard.env").write_text("TELEGRAM_BOT_TOKEN=1\nMODEL_KEY=k\nSWITCHBOARD_MODEL=llama3\n")
    complete = invoke("install", "--user", "--dry-run", "--config", str(config), "--home", str(home),
                      "--unit-dir", str(units))
    assert "note:" not in complete.output  # nothing missing, nothing to say


def test_dry_run_prints_only_the_unit_on_stdout_and_it_passes_verify(tmp_path):
    analyze = _analyze()
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  api_key: ${MODEL_KEY}\n")  # a variable the env file lacks: a note
    switchboard = Path(os.sys.executable).parent / "switchboard"
    proc = subprocess.run(
        [switchboard, "service", "install", "--user", "--dry-run", "--config", str(config),
         "--home", str(tmp_path / "home"), "--unit-dir", str(tmp_path / "units")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "note: the config reads MODEL_KEY (no default)" in proc.stderr
    assert "# then run:" in proc.stderr and "systemctl --user" in proc.stderr
    assert proc.stdout == plan_install("user", config=config, home=tmp_path / "home",
                                       unit_dir=tmp_path / "units").unit_text
    unit = tmp_path / "switchboard.service"
    unit.write_text(proc.stdout)  # what `--dry-run > switchboard.service` leaves
    check = subprocess.run([analyze, "--user", "verify", str(unit)], capture_output=True, text=True, timeout=60,
                           env=_user_env(tmp_path))
    assert (check.returncode, check.stdout + check.stderr) == (0, "")


def test_install_warns_when_the_unit_would_run_the_source_trees_example_config(tmp_path):
    example = Path(gateway.__file__).resolve().parent.parent / "config.example.yaml"
    home = tmp_path / "home"
    result = invoke("install", "--user", "--dry-run", "--config", str(example), "--home", str(home),
                    "--unit-dir", str(tmp_path / "units"))
    assert result.exit_code == 0, result.output
    assert (f"warning: the unit would run with {example}, the example config of the source tree: a git pull or "
            f"an edit of the checkout changes the service's settings. Copy it to {home / 'config.yaml'} and pass "
            f"--config {home / 'config.yaml'}") in result.stderr.splitlines()
