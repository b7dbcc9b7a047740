"""Run the gateway as a systemd service: render, install and remove the unit.

    plan = plan_install("system", config=Path("/etc/switchboard/config.yaml"),
                        home=Path("/var/lib/switchboard"), run_as="switchboard")
    print(plan.unit_text)          # what would be written (--dry-run)
    result = install(plan)         # writes the unit, creates the home and the env file
    print(*plan.commands, sep="\\n")   # what the operator runs next

Nothing here runs ``systemctl``: installing prints the exact commands (the
operator runs them, as root for a system unit), so the same code is testable on
a machine without systemd.  Only :func:`service_status` calls ``systemctl
status``, and says plainly when systemd is not running.

The templates live in ``systemd/`` at the top of the source tree (a wheel
installs them as data files under ``<prefix>/share/switchboard/systemd``); their
``@NAME@`` placeholders are filled from a :class:`UnitSettings`.  Paths go into
the unit verbatim, so a path that a unit file would need escaped (spaces,
quotes, ``%``, ``$``, backslashes) is refused with a message instead of being
half-escaped.
"""

from __future__ import annotations

import getpass
import grp
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from gateway.errors import ServiceError
from gateway.runtime import lockfile

log = logging.getLogger(__name__)

Scope = Literal["system", "user"]

UNIT_NAME = "switchboard.service"
ENV_FILENAME = "switchboard.env"
SOURCE_TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "systemd"  # a checkout (pip install -e .)
INSTALLED_TEMPLATE_PATH = ("share", "switchboard", "systemd")  # a wheel's data files (pyproject.toml)
TEMPLATES: dict[Scope, str] = {"system": "switchboard.service", "user": "switchboard-user.service"}
ENV_EXAMPLE = "switchboard.env.example"
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
WANTED_BY: dict[Scope, str] = {"system": "multi-user.target", "user": "default.target"}
DEFAULT_GRACE_SECONDS = 30
STOP_MARGIN_SECONDS = 15  # TimeoutStopSec = shutdown.grace_seconds + this
# where ProtectHome= hides things, and where PrivateTmp= does
HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))
TMP_ROOTS = (Path("/tmp"), Path("/var/tmp"))

_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+@:,=~-]*$")
_SAFE_USER = re.compile(r"^[a-z_][a-z0-9_-]*[$]?$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


@dataclass(frozen=True)
class UnitSettings:
    """Everything a rendered unit depends on; paths absolute."""

    scope: Scope
    switchboard: Path  # the virtual environment's `switchboard` script
    config: Path
    home: Path
    env_file: Path
    run_as: str | None = None  # system units only
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    # where that environment imports the gateway from (a checkout, with pip install -e .);
    # None when unknown: another environment's script was given
    package_dir: Path | None = None

    @property
    def timeout_stop_seconds(self) -> int:
        return self.grace_seconds + STOP_MARGIN_SECONDS


@dataclass(frozen=True)
class InstallPlan:
    settings: UnitSettings
    unit_path: Path
    unit_text: str
    commands: tuple[str, ...]  # to run after the unit is written, in order
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class InstallResult:
    plan: InstallPlan
    unit_changed: bool  # False when an identical unit was already there
    home_created: bool
    env_file_created: bool
    env_file_tightened: bool  # an existing env file was readable by others and is now 0600


@dataclass(frozen=True)
class UninstallResult:
    unit_path: Path
    removed: tuple[Path, ...]  # the unit file and its enablement links
    commands: tuple[str, ...]


@dataclass(frozen=True)
class StatusReport:
    lines: tuple[str, ...]
    running: bool

    @property
    def exit_code(self) -> int:
        return 0 if self.running else 3  # 3: "not running", as systemctl status says it


# --- paths -----------------------------------------------------------------


def default_unit_dir(scope: Scope) -> Path:
    if scope == "system":
        return SYSTEM_UNIT_DIR
    config_home = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(config_home) if config_home else Path.home() / ".config"
    return base / "systemd" / "user"


def default_executable() -> Path:
    """The ``switchboard`` script beside this interpreter (the virtual environment's, not the system's)."""
    # not resolve(): a venv's python is a symlink to the base interpreter, and
    # following it would leave the virtual environment
    return Path(os.path.normpath(Path(sys.executable).absolute())).parent / "switchboard"


def default_run_as() -> str:
    """The account a system unit runs as when --run-as is not given."""
    if os.geteuid() != 0:
        return getpass.getuser()
    sudo_user = os.environ.get("SUDO_USER", "").strip()
    if sudo_user and sudo_user != "root":
        return sudo_user
    raise ServiceError(
        "a system unit needs an account to run as, and root is not one: pass --run-as NAME "
        "(a dedicated account, e.g. useradd --system --home-dir /var/lib/switchboard --shell "
        "/usr/sbin/nologin switchboard)"
    )


def _check_path(what: str, path: Path) -> None:
    if not _SAFE_PATH.match(str(path)):
        raise ServiceError(
            f"{what} {str(path)!r} contains characters a unit file would need escaped "
            "(spaces, quotes, %, $ or backslashes): use a path without them"
        )


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _interpreter_of(script: Path) -> Path | None:
    """The interpreter named in a script's ``#!`` line, if it names one by absolute path."""
    try:
        with script.open("rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return Path(words[0]) if words and words[0].startswith("/") else None


def _paths_the_daemon_reads(settings: UnitSettings) -> list[Path]:
    """Every path the service must see: ProtectHome= and PrivateTmp= may hide any of them.

    Not the environment file: systemd reads it before it sets up the sandbox.
    """
    paths = [settings.switchboard, settings.switchboard.resolve(), settings.config, settings.home]
    interpreter = _interpreter_of(settings.switchboard)
    if interpreter is not None:
        paths += [interpreter, interpreter.resolve()]
    if settings.package_dir is not None:
        paths.append(settings.package_dir)  # an editable install runs from the source tree
    return paths


def protect_home_setting(settings: UnitSettings) -> str:
    """``yes`` (home directories invisible) unless the daemon needs something under them."""
    if any(_under(p, HOME_ROOTS) for p in _paths_the_daemon_reads(settings)):
        # read-only keeps them visible; ReadWritePaths= still makes the home writable
        return "read-only"
    return "yes"


# --- rendering -------------------------------------------------------------


def template_dirs() -> list[Path]:
    """Where the unit templates may be: the source tree's ``systemd/``, then the installed data files."""
    bases = dict.fromkeys([sysconfig.get_path("data"), sys.prefix])
    return [SOURCE_TEMPLATE_DIR, *(Path(base).joinpath(*INSTALLED_TEMPLATE_PATH) for base in bases)]


def read_template(name: str) -> str:
    places = [d / name for d in template_dirs()]
    for path in places:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
    raise ServiceError(
        f"unit template {name} is missing (looked in {', '.join(str(p.parent) for p in places)}): "
        "reinstall switchboard (pip install .), or run it from its source tree"
    )


def render_unit(settings: UnitSettings) -> str:
    """The unit file for ``settings``: the scope's template with every placeholder filled."""
    for what, path in (
        ("the switchboard script", settings.switchboard),
        ("the config", settings.config),
        ("the home", settings.home),
        ("the environment file", settings.env_file),
    ):
        if not path.is_absolute():
            raise ServiceError(f"{what} path {str(path)!r} must be absolute")
        _check_path(what, path)
    values = {
        "SWITCHBOARD": str(settings.switchboard),
        "CONFIG": str(settings.config),
        "HOME": str(settings.home),
        "ENV_FILE": str(settings.env_file),
        "TIMEOUT_STOP_SEC": str(settings.timeout_stop_seconds),
    }
    if settings.scope == "system":
        if not settings.run_as:
            raise ServiceError("a system unit needs an account to run as: pass --run-as NAME")
        if not _SAFE_USER.match(settings.run_as):
            raise ServiceError(f"{settings.run_as!r} is not a valid user name")
        if settings.run_as == "root":
            raise ServiceError(
                "the gateway must not run as root: pass --run-as with a dedicated account "
                "(useradd --system --home-dir /var/lib/switchboard --shell /usr/sbin/nologin switchboard)"
            )
        values["RUN_AS"] = settings.run_as
        values["PROTECT_HOME"] = protect_home_setting(settings)
    text = read_template(TEMPLATES[settings.scope])
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ServiceError(f"template {TEMPLATES[settings.scope]} has placeholders nothing fills: {', '.join(left)}")
    return text


def read_config_leniently(config: Path) -> dict:
    """The config's YAML as written (no ``${VAR}`` expansion: the secrets it names may live
    only in the service's environment file); {} when it cannot be read."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


_CONFIG_VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")
EXAMPLE_CONFIG_NAME = "config.example.yaml"
UNIT_SETS = ("SWITCHBOARD_HOME",)  # Environment= lines of the unit itself


def config_variables(config: Path) -> list[str]:
    """The environment variables the config's values name with ``${VAR}`` (first use first)."""
    return list(_config_variable_defaults(config))


def _config_variable_defaults(config: Path) -> dict[str, bool]:
    """Each variable the config's values name with ``${VAR}``, and whether every use gives a default
    (``${VAR:-default}``)."""
    found: dict[str, bool] = {}

    def walk(value) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            for match in _CONFIG_VAR.finditer(value):
                if match.group(1):
                    found[match.group(1)] = found.get(match.group(1), True) and match.group(2) is not None

    walk(read_config_leniently(config))
    return {name: defaulted for name, defaulted in found.items() if name not in UNIT_SETS}


def env_file_names(env_file: Path) -> set[str]:
    """The variables an environment file sets (``NAME=value`` lines); empty when it cannot be read."""
    try:
        text = env_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    return {m.group(1) for m in map(_ENV_LINE.match, text.splitlines()) if m}


def environment_reminder(settings: UnitSettings, environ: Mapping[str, str] | None = None) -> str | None:
    """The variables the service would miss, or None: those the config reads that the environment file does
    not set, and that either have no default in the config or are exported in this shell (``environ``), so
    the operator uses them; systemd does not see the shell's variables."""
    environ = os.environ if environ is None else environ
    in_file = env_file_names(settings.env_file)
    missing = [(name, "no default" if not defaulted else "set in this shell")
               for name, defaulted in _config_variable_defaults(settings.config).items()
               if name not in in_file and (not defaulted or environ.get(name))]
    if not missing:
        return None
    shown = ", ".join(f"{name} ({why})" for name, why in missing)
    them = "it" if len(missing) == 1 else "them"
    return (f"the config reads {shown} from the environment, and {settings.env_file} does not set {them}: "
            f"systemd does not see variables exported in your shell, so put {them} there (NAME=value lines)")


def grace_seconds_from_config(config: Path) -> int | None:
    """``shutdown.grace_seconds`` when the config states it as a plain number, else None."""
    shutdown = read_config_leniently(config).get("shutdown")
    grace = shutdown.get("grace_seconds") if isinstance(shutdown, dict) else None
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        return None
    return int(-(-grace // 1))  # round up


def _config_home_mismatch(config: Path, home: Path) -> str | None:
    """A warning when the config pins ``home:`` to another directory than the unit makes writable."""
    value = read_config_leniently(config).get("home")
    if not isinstance(value, str) or "$" in value or value.startswith("~"):
        return None  # follows SWITCHBOARD_HOME (which the unit sets), or depends on the account
    pinned = Path(value) if Path(value).is_absolute() else config.parent / value
    if pinned.resolve() == home:
        return None
    return (
        f"{config} sets home: {value}, but the unit gives the service {home} (SWITCHBOARD_HOME, "
        f"ReadWritePaths=): pass --home {pinned.resolve()}, or write home: ${{SWITCHBOARD_HOME}} in the config"
    )


def systemctl_commands(scope: Scope, unit_path: Path, run_as: str | None = None) -> tuple[str, ...]:
    """What to run after writing ``unit_path``, in order."""
    ctl = "systemctl" if scope == "system" else "systemctl --user"
    journal = "journalctl" if scope == "system" else "journalctl --user"
    commands = []
    if unit_path.parent != default_unit_dir(scope):
        # systemd does not look in other directories; `link` makes it see this one
        commands.append(f"{ctl} link {unit_path}")
    commands += [f"{ctl} daemon-reload", f"{ctl} enable --now {UNIT_NAME}"]
    if scope == "user":
        # without lingering, the user manager (and the gateway) stops at logout
        commands.append(f"loginctl enable-linger {run_as or getpass.getuser()}")
    commands += [f"{ctl} status {UNIT_NAME}", f"{journal} -u {UNIT_NAME} -f"]
    return tuple(commands)


def plan_install(
    scope: Scope,
    *,
    config: Path,
    home: Path,
    unit_dir: Path | None = None,
    env_file: Path | None = None,
    run_as: str | None = None,
    executable: Path | None = None,
    grace_seconds: int | None = None,
    package_dir: Path | None = None,
) -> InstallPlan:
    """Render the unit for real paths and say what installing it involves; changes nothing.

    ``package_dir`` is where the executable's environment imports the gateway from; by
    default this process's own package when ``executable`` is this environment's script,
    and unknown (not checked) for another environment's script.
    """
    if package_dir is None and executable is None:
        package_dir = Path(__file__).resolve().parents[1]  # the gateway package
    if scope not in TEMPLATES:
        raise ServiceError(f"unknown scope {scope!r}: use system or user")
    switchboard = Path(os.path.normpath((executable or default_executable()).absolute()))
    if not (switchboard.is_file() and os.access(switchboard, os.X_OK)):
        raise ServiceError(
            f"{switchboard} is not an executable switchboard script: install the package into "
            "the virtual environment the service should use (pip install -e .) and run this "
            "command with that environment's switchboard"
        )
    config = Path(config).expanduser()
    if not config.is_file():
        raise ServiceError(
            f"config file {config} does not exist: write it first (start from config.example.yaml, "
            "check it with switchboard config check --config FILE)"
        )
    config = config.resolve()
    home = Path(home).expanduser().absolute().resolve()
    env_file = Path(env_file).expanduser().absolute().resolve() if env_file else home / ENV_FILENAME
    warnings: list[str] = []
    account = None
    if scope == "system":
        run_as = run_as or default_run_as()
        try:
            account = pwd.getpwnam(run_as)
        except KeyError:
            warnings.append(
                f"user {run_as!r} does not exist: create it before starting the service "
                f"(useradd --system --home-dir {home} --shell /usr/sbin/nologin {run_as})"
            )
    else:
        run_as = None
    if grace_seconds is None:
        grace_seconds = grace_seconds_from_config(config)
    if grace_seconds is None:
        grace_seconds = DEFAULT_GRACE_SECONDS
    mismatch = _config_home_mismatch(config, home)
    if mismatch:
        warnings.append(mismatch)
    if config.name == EXAMPLE_CONFIG_NAME:
        warnings.append(
            f"the unit would run with {config}, the example config of the source tree: a git pull or an edit "
            f"of the checkout changes the service's settings. Copy it to {home / 'config.yaml'} and pass "
            f"--config {home / 'config.yaml'}"
        )
    settings = UnitSettings(
        scope=scope, switchboard=switchboard, config=config, home=home,
        env_file=env_file, run_as=run_as, grace_seconds=grace_seconds,
        package_dir=Path(package_dir).absolute() if package_dir is not None else None,
    )
    text = render_unit(settings)
    if account is not None:
        warnings.extend(_access_warnings(settings, account))
    if scope == "system":
        hidden = sorted({str(p) for p in _paths_the_daemon_reads(settings) if _under(p, TMP_ROOTS)})
        if hidden:
            warnings.append(
                "PrivateTmp=yes gives the service its own empty /tmp, so it will not see "
                f"{', '.join(hidden)}: use paths outside /tmp and /var/tmp"
            )
    unit_path = Path(unit_dir or default_unit_dir(scope)).expanduser().absolute() / UNIT_NAME
    return InstallPlan(
        settings=settings,
        unit_path=unit_path,
        unit_text=text,
        commands=systemctl_commands(scope, unit_path, getpass.getuser() if scope == "user" else None),
        warnings=tuple(warnings),
    )


def _blocked_at(path: Path, account: pwd.struct_passwd, need: int) -> Path | None:
    """Where ``account`` is stopped on its way to ``path`` (a directory it cannot enter, or
    the file itself lacking ``need`` = r4/w2/x1 bits), or None.  Mode bits only, no ACLs."""
    if account.pw_uid == 0:
        return None
    groups = set(os.getgrouplist(account.pw_name, account.pw_gid))

    def allows(st: os.stat_result, bits: int) -> bool:
        if st.st_uid == account.pw_uid:
            shift = 6
        elif st.st_gid in groups:
            shift = 3
        else:
            shift = 0
        return (st.st_mode >> shift) & bits == bits

    for step in [*reversed(path.parents), path]:
        try:
            st = step.stat()
        except OSError:
            return None  # does not exist (yet): nothing to say about its permissions
        if not allows(st, need if step == path else 1):
            return step
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _access_warnings(settings: UnitSettings, account: pwd.struct_passwd) -> list[str]:
    """What the service account will not be able to read, execute or write."""
    name = account.pw_name
    venv_hint = (
        "install switchboard in a virtual environment that account can read (for example "
        "python3 -m venv /opt/switchboard; /opt/switchboard/bin/pip install .) and run that "
        "environment's `switchboard service install`"
    )
    checks: list[tuple[Path, int, str]] = [(settings.switchboard, 5, venv_hint)]
    interpreter = _interpreter_of(settings.switchboard)
    if interpreter is not None:
        checks.append((interpreter.resolve(), 1, venv_hint))
    if settings.package_dir is not None:
        checks.append((settings.package_dir, 5, venv_hint))
    checks += [
        (settings.config, 4, f"let it read the file (chgrp {_group_name(account.pw_gid)} FILE; chmod g+r FILE)"),
        (settings.home, 7, f"give it the home (chown -R {name} {settings.home})"),
    ]
    warnings = []
    for path, need, hint in checks:
        blocked = _blocked_at(path, account, need)
        if blocked is not None:
            where = "" if blocked == path else f" (no permission at {blocked})"
            warnings.append(f"user {name!r} cannot use {path}{where}: {hint}")
    return warnings


# --- installing ------------------------------------------------------------


def _write_atomically(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _ensure_home(settings: UnitSettings) -> bool:
    home = settings.home
    if home.exists():
        if not home.is_dir():
            raise ServiceError(f"home {home} exists and is not a directory: choose another --home")
        return False
    home.mkdir(mode=0o700, parents=True)
    os.chmod(home, 0o700)  # mkdir's mode passes through the umask
    if settings.scope == "system" and settings.run_as and os.geteuid() == 0:
        try:
            account = pwd.getpwnam(settings.run_as)
        except KeyError:
            pass  # warned about in the plan; root keeps it until the account exists
        else:
            os.chown(home, account.pw_uid, account.pw_gid)
    return True


def _env_file_text(example: str, wanted: Mapping[str, str]) -> str:
    """The example with each of ``wanted`` (the config's variables set in this shell) filled in: its
    commented line uncommented with the value, or, when the example lacks it, a line at the end."""
    lines, done = [], set()
    for line in example.splitlines():
        name = line.lstrip("#").partition("=")[0].strip()
        if line.startswith("#") and "=" in line and name in wanted and name not in done:
            lines.append(f"{name}={wanted[name]}")
            done.add(name)
        else:
            lines.append(line)
    rest = [f"{name}={value}" for name, value in wanted.items() if name not in done]
    if rest:
        lines += ["", "# Read by the config, as exported in the shell that ran `switchboard service install`:", *rest]
    return "\n".join(lines) + "\n"


def _ensure_env_file(path: Path, wanted: Mapping[str, str] | None = None) -> tuple[bool, bool]:
    """Create the env file from the example (0600), with ``wanted`` filled in, or tighten an existing one
    to 0600.

    Returns (created, tightened).  The contents are never printed.
    """
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            os.chmod(path, 0o600)
            return False, True
        return False, False
    example = _env_file_text(read_template(ENV_EXAMPLE), wanted or {})
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, example.encode("utf-8"))
    finally:
        os.close(fd)
    return True, False


def install(plan: InstallPlan, environ: Mapping[str, str] | None = None) -> InstallResult:
    """Write the unit; create the home (0700) and the env file (0600) when they are missing, the latter
    with the variables the config reads that this shell (``environ``) exports filled in."""
    environ = os.environ if environ is None else environ
    home_created = _ensure_home(plan.settings)
    wanted = {name: environ[name] for name in _config_variable_defaults(plan.settings.config) if environ.get(name)}
    env_created, env_tightened = _ensure_env_file(plan.settings.env_file, wanted)
    unit_path = plan.unit_path
    try:
        unchanged = unit_path.read_text(encoding="utf-8") == plan.unit_text
    except OSError:
        unchanged = False
    if not unchanged:
        unit_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            _write_atomically(unit_path, plan.unit_text, 0o644)
        except PermissionError:
            raise ServiceError(
                f"cannot write {unit_path}: "
                + ("run as root (sudo) for a system unit" if plan.settings.scope == "system" else "check that directory's permissions")
            ) from None
    log.info("unit %s %s", unit_path, "unchanged" if unchanged else "written")
    _record_install(plan.settings.home, plan.settings.scope, unit_path)
    return InstallResult(
        plan=plan,
        unit_changed=not unchanged,
        home_created=home_created,
        env_file_created=env_created,
        env_file_tightened=env_tightened,
    )


def _enablement_links(scope: Scope, unit_path: Path) -> list[Path]:
    """``<target>.wants/switchboard.service`` links that `systemctl enable` made (or would have)."""
    links = []
    for unit_dir in {unit_path.parent, default_unit_dir(scope)}:
        link = unit_dir / f"{WANTED_BY[scope]}.wants" / UNIT_NAME
        if link.is_symlink():
            links.append(link)
    return links


INSTALLED_MARKER = ".service-unit"  # in the home: where `service install` put the unit, and its scope


def installed_unit(home: Path) -> tuple[Scope, Path] | None:
    """The scope and path `service install` recorded in ``home`` (a --unit-dir included), if any."""
    try:
        scope, _, path = (Path(home) / INSTALLED_MARKER).read_text(encoding="utf-8").strip().partition(" ")
    except OSError:
        return None
    return (scope, Path(path)) if scope in TEMPLATES and path else None


def _record_install(home: Path, scope: Scope, unit_path: Path) -> None:
    try:
        _write_atomically(Path(home) / INSTALLED_MARKER, f"{scope} {unit_path}\n", 0o600)
    except OSError as exc:  # only status and uninstall's default lose it
        log.warning("could not record where the unit went (%s): %s", Path(home) / INSTALLED_MARKER, exc)


def _runs_as_service(pid: int | None) -> bool | None:
    """Whether process ``pid`` runs in the unit's cgroup (started by systemd); None when that is unknown."""
    if not pid:
        return None
    try:
        return UNIT_NAME in Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8")
    except OSError:
        return None


def uninstall(scope: Scope, *, home: Path, unit_dir: Path | None = None) -> UninstallResult:
    """Remove the unit file and its enablement links; the home and the env file stay.

    Refused while a daemon holds the home's lock: stop the service first, so it
    is not left running from a unit file that no longer exists; a daemon started in
    a terminal (`make run`) is stopped there instead.
    """
    unit_path = Path(unit_dir or default_unit_dir(scope)).expanduser().absolute() / UNIT_NAME
    ctl = "systemctl" if scope == "system" else "systemctl --user"
    if daemon_running(home):
        pid = lockfile.holder_pid(home)
        as_service = _runs_as_service(pid)
        if as_service is False or (as_service is None and not unit_path.exists()):
            raise ServiceError(
                f"a daemon started outside systemd (make run, switchboard run) is running on {home}"
                + (f" as pid {pid}" if pid else "") + ": stop it where it runs (Ctrl-C in its terminal"
                + (f", or kill {pid}" if pid else "") + "), then uninstall")
        raise ServiceError(
            f"the daemon is running on {home}: stop it first ({ctl} disable --now {UNIT_NAME}), then uninstall"
        )
    removed = []
    for path in _enablement_links(scope, unit_path) + ([unit_path] if unit_path.exists() or unit_path.is_symlink() else []):
        try:
            path.unlink()
        except PermissionError:
            raise ServiceError(f"cannot remove {path}: run as root (sudo) for a system unit") from None
        removed.append(path)
    commands = (f"{ctl} daemon-reload", f"{ctl} reset-failed {UNIT_NAME}") if removed else ()
    marker = installed_unit(home)
    if marker is not None and marker[1] == unit_path:
        (Path(home) / INSTALLED_MARKER).unlink(missing_ok=True)
    return UninstallResult(unit_path=unit_path, removed=tuple(removed), commands=commands)


# --- status ----------------------------------------------------------------


def daemon_running(home: Path) -> bool:
    """True when a daemon holds ``<home>/switchboard.lock``."""
    return lockfile.is_locked(Path(home))


def systemd_running() -> bool:
    """Whether systemd is this machine's init (the test ``sd_booted()`` makes) and systemctl exists."""
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def service_status(scope: Scope, *, home: Path, unit_dir: Path | None = None) -> StatusReport:
    """What is installed and what runs, as lines for the terminal."""
    home = Path(home)
    unit_path = Path(unit_dir or default_unit_dir(scope)).expanduser().absolute() / UNIT_NAME
    flag = "--system" if scope == "system" else "--user"
    lines = []
    if unit_path.exists():
        enabled = bool(_enablement_links(scope, unit_path))
        lines.append(f"unit: {unit_path} ({'enabled' if enabled else 'installed, not enabled'})")
    else:
        lines.append(f"unit: not installed at {unit_path} (switchboard service install {flag})")
    running = daemon_running(home)
    if running:
        pid = lockfile.holder_pid(home)
        lines.append(f"daemon: running on {home}" + (f" (pid {pid})" if pid else ""))
    else:
        lines.append(f"daemon: not running on {home}")
    if not systemd_running():
        lines.append(
            "systemd: not running on this machine (no /run/systemd/system), so there is no "
            "service state to show; `switchboard run` starts the daemon in the foreground"
        )
        return StatusReport(lines=tuple(lines), running=running)
    argv = ["systemctl"] + (["--user"] if scope == "user" else []) + ["status", "--no-pager", "--lines=10", UNIT_NAME]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        lines.append(f"systemd: `{' '.join(argv)}` failed: {exc}")
    else:
        lines.append(f"systemd ({' '.join(argv)}):")
        lines.extend((proc.stdout or proc.stderr).rstrip("\n").splitlines())
    return StatusReport(lines=tuple(lines), running=running)
