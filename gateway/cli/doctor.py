"""``switchboard doctor``: every check an operator would make by hand, each with its fix.

Each :class:`Check` is ✓ (ok), ✗ (problem, with what to do) or – (could not
be checked here, and why).  Network checks run concurrently with a timeout;
nothing is written anywhere.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

import state
from gateway import _config_load
from gateway.config import Config, load_config
from gateway.durations import format_duration, time_ago
from gateway.errors import ConfigError
from gateway.modelprobe import probe_models
from gateway.runtime import systemd as service
from gateway.runtime.autobackup import list_backups
from gateway.runtime.upkeep import EVERY_SECONDS as UPKEEP_EVERY_SECONDS

TIMEOUT = aiohttp.ClientTimeout(total=10)
MIN_FREE_BYTES = 200 * 1024 * 1024
WAL_WARN_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool | None  # None: skipped
    detail: str
    fix: str | None = None

    def line(self) -> str:
        mark = {True: "✓", False: "✗", None: "–"}[self.ok]
        text = f"{mark} {self.name}: {self.detail}"
        return text + (f"\n    fix: {self.fix}" if self.fix and self.ok is False else "")


def report(checks: list[Check]) -> dict:
    """What ``doctor --json`` prints: ``{"ok", "problems", "checks": [{"name", "ok", "detail", "fix"}]}``;
    a check's ``ok`` is null when it was skipped, its ``fix`` null when there is nothing to do."""
    problems = sum(1 for c in checks if c.ok is False)
    return {"ok": problems == 0, "problems": problems,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix if c.ok is False else None}
                       for c in checks]}


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def check_postgresql(url: str) -> list[Check]:
    """store.url: the server answers and holds our schema (read only; the password never shows)."""
    version, detail = state.probe_store(url)
    if version is None:
        return [Check("database", False, detail,
                      "check store.url (host, port, user, password, database) and that the server is running")]
    supported = state.schema.current_version()
    return [Check("database", True, f"{detail}: schema version {version} (this Switchboard: {supported})"
                  + ("; migrates at next start" if version < supported else ""))]


def check_database(home: Path) -> list[Check]:
    report = state.inspect_database(home / "state.db")
    if not report.exists:
        return [Check("database", True, f"{report.path} not created yet (the first start creates it)")]
    if report.refused:
        return [Check("database", False, report.refused, "restore a backup: switchboard restore FILE")]
    checks = [
        Check("database integrity", report.quick_check == "ok", f"PRAGMA quick_check: {report.quick_check}",
              "stop the daemon and restore a backup: switchboard restore FILE"),
        Check("schema", True, f"version {report.schema_version} (this Switchboard: {report.supported_version})"
              + ("; migrates at next start" if (report.schema_version or 0) < report.supported_version else "")),
        Check("WAL", report.wal_bytes < WAL_WARN_BYTES, f"{_mib(report.wal_bytes)} (database {_mib(report.size_bytes)})",
              "a long-lived reader blocks checkpoints: restart the daemon, or run switchboard backup to check"),
        _upkeep_check(report),
    ]
    if report.dead_letters is not None:
        held = report.dead_letters
        checks.append(Check(
            "dead letters", held == 0,
            f"{held} event{'s' if held != 1 else ''} set aside after failing three times" if held else "none held",
            "see them with: switchboard deadletters list; after fixing the cause, replay one with: switchboard "
            "deadletters retry ID, or give it up with: switchboard deadletters drop ID"))
    return checks


def _upkeep_check(report: state.DatabaseReport) -> Check:
    """The daemon's store upkeep: when it last ran (and the next, a day later), free space left inside."""
    last = report.last_upkeep

    def when(ts: float) -> str:
        return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")

    detail = (f"last {when(last['finished_at'])} ({last['sessions_pruned']} sessions pruned), next about "
              f"{when(last['finished_at'] + UPKEEP_EVERY_SECONDS)}" if last else "not run yet (the daemon runs it a day apart)")
    stuck = report.auto_vacuum != "incremental" and report.free_bytes > 0
    if stuck:
        detail += f"; {_mib(report.free_bytes)} free inside the file"
    return Check("store upkeep", not stuck, detail,
                 "stop the daemon and run: switchboard maintenance --vacuum (returns the space once, for good)")


def check_backups(cfg: Config) -> Check:
    """The newest automatic backup (``backup.every``) and its age; a problem once it is two periods old."""
    every = cfg.backup.every
    if cfg.store.url:
        return Check("backups", None, "PostgreSQL: back it up with pg_dump (see docs/operating.md)")
    if every is None:
        return Check("backups", None, "automatic backups are off (set backup.every, e.g. 1d); "
                                      "switchboard backup FILE makes one now")
    found = list_backups(cfg.backup_dir)
    if not found:
        return Check("backups", None, f"none in {cfg.backup_dir} yet (every {format_duration(every)}; "
                                      "the running daemon makes the first soon after it starts)")
    newest = found[-1]
    at = newest.stat().st_mtime
    age = time.time() - at
    detail = (f"newest {newest} ({_mib(newest.stat().st_size)}, {time_ago(at)}); {len(found)} kept of "
              f"{cfg.backup.keep}, every {format_duration(every)}")
    return Check("backups", age <= 2 * every, detail,
                 "is the daemon running? Look for 'automatic backup ... failed' in its log (a full disk, "
                 "a folder it cannot write)")


def check_disk(home: Path) -> Check:
    probe = next(p for p in (home, *home.parents) if p.exists())  # the home, or where it will be made
    free = shutil.disk_usage(probe).free
    return Check("disk", free >= MIN_FREE_BYTES, f"{_mib(free)} free at {probe}",
                 f"free space on the disk holding {probe}: a full disk stops every write")


def check_permissions(home: Path) -> list[Check]:
    checks = []
    if home.exists():
        mode = stat.S_IMODE(home.stat().st_mode)
        checks.append(Check("home permissions", mode & 0o077 == 0, f"{home} is {mode:04o}", f"chmod 700 {home}"))
    for name in ("state.db", service.ENV_FILENAME):
        path = home / name
        if path.exists():
            mode = stat.S_IMODE(path.stat().st_mode)
            checks.append(Check(f"{name} permissions", mode & 0o077 == 0, f"{path} is {mode:04o}", f"chmod 600 {path}"))
    return checks


def check_context_length(cfg: Config) -> Check:
    from compression import context_length_for
    from gateway.windows import learned_windows

    try:
        tokens, warning = context_length_for(cfg.model.name, cfg.model.context_length)
    except ValueError as exc:
        return Check("context length", False, str(exc), "set model.context_length")
    learned = learned_windows(cfg.home).get("default")
    if learned is not None and learned.get("model") == cfg.model.name and learned["window"] != tokens:
        # the daemon's model client met a context-length error (or an empty answer cut by the window) naming it
        return Check("context length", False,
                     f"the model's server said its window is {learned['window']:,} tokens (the daemon learned it "
                     f"on {time.strftime('%Y-%m-%d %H:%M', time.localtime(learned.get('at') or 0))}), not the "
                     f"{tokens:,} {'configured' if cfg.model.context_length else 'assumed'}",
                     f"set model.context_length: {learned['window']} in the config")
    if warning:
        return Check("context length", None, warning)
    source = "model.context_length" if cfg.model.context_length else f"known window of {cfg.model.name!r}"
    return Check("context length", True, f"{tokens:,} tokens ({source})")


async def check_model(http: aiohttp.ClientSession, cfg: Config) -> Check:
    """The ``model`` section's endpoint (the chain's ``default``)."""
    return await check_endpoint(http, "model", "model", str(cfg.model.base_url), cfg.model.api_key, cfg.model.name,
                                cfg=cfg)


async def check_fallbacks(http: aiohttp.ClientSession, cfg: Config) -> list[Check]:
    """Each model of ``model.fallbacks``, in order: reachable, and serving its model name."""
    return list(await asyncio.gather(*(
        check_endpoint(http, f"fallback {label}", f"models.{label}", str(cfg.models[label].base_url),
                       cfg.models[label].api_key, cfg.models[label].name, cfg=cfg)
        for label in cfg.model.fallbacks)))


async def check_endpoint(http: aiohttp.ClientSession, what: str, key: str, base_url: str, api_key: str,
                         name: str, *, cfg: Config | None = None) -> Check:
    """``GET /models``: a ✗ with the likely fix for an unreachable server, a refused key, a URL that
    answers 404 (usually a missing ``/v1``) or a server that does not serve ``name``."""
    probe = await probe_models(http, base_url, api_key, timeout=TIMEOUT)
    problem = probe.problem(name)
    if problem is None:
        if probe.served:
            return Check(what, True, f"{probe.base_url} serves {name!r}")
        return Check(what, True, f"{probe.base_url} is reachable (it lists no models, so {name!r} was not checked)")
    def variable(k: str) -> str | None:
        names = cfg.variables_for(k) if cfg is not None else ()
        return names[0] if names else None

    return Check(what, False, problem, probe.fix(name, key, (variable(f"{key}.base_url"), variable(f"{key}.name"))))
async def _platform_call(http, name, method, url, headers, ok) -> Check:
    try:
        async with http.request(method, url, headers=headers) as r:
            body = await r.json(content_type=None) if r.content_type.endswith("json") else {}
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return Check(name, False, f"cannot reach the API: {type(exc).__name__}", f"check platforms.{name} URLs and the network")
    who = ok(status, body)
    if who:
        return Check(name, True, f"token valid ({who})")
    return Check(name, False, f"the token was refused (HTTP {status})", f"set a valid token for platforms.{name}")


async def _ready(check: Check) -> Check:
    return check


async def check_platforms(http: aiohttp.ClientSession, cfg: Config) -> list[Check]:
    calls = []
    for name, status in cfg.enabled_platforms().items():
        if status != "on":
            calls.append(_ready(Check(name, None, status)))
            continue
        section = cfg.platforms.sections()[name]
        check = section.credential_check()
        if check is None:  # the platform checks itself (PlatformConfig.probe)
            calls.append(_probe(name, section))
            continue
        calls.append(_platform_call(http, name, check.method, check.url, check.headers, check.who))
    return list(await asyncio.gather(*calls))


async def _probe(name: str, section) -> Check:
    try:
        found = await asyncio.wait_for(section.probe(TIMEOUT.total or 10.0), (TIMEOUT.total or 10.0) * 2)
    except Exception as exc:  # noqa: BLE001 - a platform's own check failing is a failed check, said so
        return Check(name, False, f"its check failed: {type(exc).__name__}", f"check platforms.{name}")
    if found is None:
        return Check(name, None, "on (doctor has no check for this platform)")
    ok, detail, fix = found
    return Check(name, ok, detail, fix or None)


def check_unit(home: Path) -> Check:
    if not service.systemd_running():
        return Check("service", None, "systemd is not running on this machine; the unit cannot be checked here")
    report = service.service_status("system", home=home)
    return Check("service", report.running, "; ".join(report.lines),
                 "switchboard service install, then the systemctl commands it prints")


def _config_fix(exc: ConfigError) -> str:
    """The fix line for a config that does not load: the key, the file, or (no file at all) the one to use."""
    if exc.key:
        return "fix the key named above, then: switchboard config check"
    if exc.file and not Path(exc.file).expanduser().exists():
        example = _config_load.example_config()
        if example is not None:
            return f"use the config `make run` uses: --config {example}, or copy it to {Path(exc.file).expanduser()}"
        return f"write a config at {Path(exc.file).expanduser()} (start from config.example.yaml), or pass --config FILE"
    return "fix the file named above, then: switchboard config check"


async def run_checks(config_path: Path | None, home: Path | None = None) -> list[Check]:
    """Every check; ``home`` (``--home``) replaces the config's home."""
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        home = home or state.default_home()
        detail = str(exc)
        if exc.file and not Path(exc.file).expanduser().exists():  # where it looked; what to do is the fix line
            detail = detail.split("; ", 1)[0]
        return [Check("config", False, detail, _config_fix(exc)),
                *check_database(home), check_disk(home), *check_permissions(home)]
    if home is not None and home != cfg.home:
        cfg = cfg.model_copy(update={"home": home})
    found, how = _config_load.locate(config_path, os.environ)
    checks = [Check("config", True, f"{cfg.source} is valid" + (f" ({how})" if found == _config_load.example_config()
                                                                  else ""))]
    home = cfg.home
    if cfg.store.url:
        checks += await asyncio.to_thread(check_postgresql, cfg.store.url)
    else:
        checks += await asyncio.to_thread(check_database, home)
    checks.append(await asyncio.to_thread(check_backups, cfg))
    checks.append(await asyncio.to_thread(check_disk, home))
    checks += check_permissions(home)
    async with aiohttp.ClientSession(timeout=TIMEOUT, trust_env=False) as http:
        model, fallbacks, platforms = await asyncio.gather(check_model(http, cfg), check_fallbacks(http, cfg),
                                                           check_platforms(http, cfg))
    checks.append(model)
    checks += fallbacks
    checks.append(check_context_length(cfg))
    checks += platforms
    checks.append(await asyncio.to_thread(check_unit, home))
    return checks
