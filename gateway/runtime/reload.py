"""SIGHUP: re-read the config and apply what can change without dropping a conversation.

Applied live: ``auth`` and ``platforms.<p>.allowed_users`` (allowlists),
``sessions`` (reset policies, key policy for new keys), ``platforms``
(tokens and settings: a changed platform's adapter alone is restarted, a
platform turned on is started, one turned off is stopped, one that refused its
token is tried again), ``cron.jobs``
(stored and re-armed: a job whose schedule did not change keeps its next
run), ``tools`` (the rules at once; MCP servers added, removed, and restarted
when their settings changed) and ``shutdown``.  Everything else (``home``, ``agent``, ``model``,
``api``, ``logging``, ``store``, ...) is reported as needing a restart; the
running values stay in force.

Every reload logs one line: what was applied and what needs a restart, or
why nothing was.  A file that does not load or validate (cron jobs included)
changes nothing; an error while applying puts the running config back.

A reload is part of the daemon's runtime: it swaps the config the daemon runs
on, so it is handed the running daemon, seen through :class:`Running` (exactly
what it changes: the config, the router's authorizer and settings, the
platforms' adapters and cron).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Mapping, Protocol

import state
from gateway.config import Config, load_config
from gateway.cron.service import CronService, config_jobs
from gateway.errors import ConfigError, SwitchboardError
from gateway.keys import KeyPolicy
from gateway.platforms import installed_platforms
from gateway.tools_mcp import McpTools
from gateway.types import Adapter

log = logging.getLogger(__name__)

LIVE_SECTIONS = ("auth", "sessions", "platforms", "cron", "tools", "shutdown")


class Rerouted(Protocol):
    """What a reload changes in the router (:class:`gateway.router.SessionRouter` is one): who may talk,
    and its settings (``gateway.router.RouterSettings``), whose keys and reset policy come from the new config."""

    authorizer: Any
    settings: Any


class Running(Protocol):
    """What a reload changes in the running daemon (:class:`gateway.runtime.daemon.Gateway` is one)."""

    config: Config  # the config in force: adapters and cron are rebuilt from it

    @property
    def router(self) -> Rerouted | None: ...

    @property
    def cron(self) -> CronService | None: ...

    @property
    def adapters(self) -> Mapping[str, Adapter]: ...  # the platforms whose adapter runs now

    @property
    def mcp(self) -> McpTools: ...  # the MCP tool servers

    @property
    def rejected_platforms(self) -> Container[str]: ...  # refused their token: a reload tries them again

    async def restart_platform(self, name: str) -> None:
        """Stop ``name``'s adapter, if any, and start it again from ``config``."""


AuthSettingsFor = Callable[[Config], object]  # the authorizer's settings for a config


@dataclass
class ReloadResult:
    """What one reload did; ``error`` set means the running config stayed in force."""

    applied: list[str] = field(default_factory=list)  # live sections that changed
    restarted_platforms: list[str] = field(default_factory=list)
    cron: dict = field(default_factory=dict)  # {added, changed, removed} job ids
    tools: dict = field(default_factory=dict)  # {added, restarted, removed} MCP servers
    needs_restart: list[str] = field(default_factory=list)
    error: str | None = None
    refused: bool = False  # the file did not load or validate (else: applying it failed)

    def summary(self) -> str:
        """The one log line for this reload."""
        if self.refused:
            return f"config reload refused, the running config stays in force: {self.error}"
        if self.error is not None:
            return f"config reload failed while applying it, the running config was put back: {self.error}"
        parts = []
        for section in self.applied:
            if section == "platforms" and self.restarted_platforms:
                parts.append(f"platforms (restarted {', '.join(self.restarted_platforms)})")
            elif section == "cron":
                jobs = "; ".join(f"{what} {', '.join(ids)}" for what, ids in self.cron.items() if ids)
                parts.append(f"cron ({jobs or 'no job changed'})")
            elif section == "tools":
                servers = "; ".join(f"{what} {', '.join(names)}" for what, names in self.tools.items() if names)
                parts.append(f"tools ({servers or 'rules only'})")
            else:
                parts.append(section)
        applied = f"applied {', '.join(parts)}" if parts else "no live setting changed"
        restart = f"; these keys need a restart to apply: {', '.join(self.needs_restart)}" if self.needs_restart else ""
        return f"config reloaded: {applied}{restart}"


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted paths whose values differ between two plain dicts."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, path + ".")
        elif a != b:
            keys.append(path)
    return keys


def needs_restart(old: Config, new: Config) -> list[str]:
    diff = changed_keys(old.model_dump(mode="json"), new.model_dump(mode="json"))
    return [k for k in diff if k.split(".")[0] not in LIVE_SECTIONS]


async def reload_config(running: Running, auth_settings: AuthSettingsFor, *, clock: Callable[[], float],
                        load=load_config) -> ReloadResult:
    """Re-read ``running.config.source``, apply it to the running daemon and log one line saying
    what happened.  Never raises for a bad file or a failed apply: ``error`` says why."""
    try:
        new = await asyncio.to_thread(load, running.config.source)
        config_jobs(new, now=clock())  # cron jobs are validated by their own module
    except ConfigError as exc:
        result = ReloadResult(error=str(exc), refused=True)
        log.error("%s", result.summary())
        return result
    try:
        result = await apply_reload(running, new, auth_settings)
    except Exception as exc:  # reported below; the running config is put back
        expected = isinstance(exc, (SwitchboardError, state.StateError))  # says what to do; no traceback needed
        result = ReloadResult(error=str(exc) if expected else f"{type(exc).__name__}: {exc}")
        log.error("%s", result.summary(), exc_info=not expected)
        return result
    (log.warning if result.needs_restart else log.info)("%s", result.summary())
    return result


async def apply_reload(running: Running, new: Config, auth_settings: AuthSettingsFor) -> ReloadResult:
    """Apply ``new`` to the running daemon.  On an error part-way, the sections already
    applied are applied again from the running config, then the error is raised."""
    old: Config = running.config
    result = ReloadResult(applied=[s for s in LIVE_SECTIONS if getattr(old, s) != getattr(new, s)],
                          needs_restart=needs_restart(old, new))
    try:
        result.restarted_platforms, result.cron, result.tools = await _apply(running, old, new, auth_settings)
    except asyncio.CancelledError:  # shutdown: the gateway is being stopped, restart nothing
        running.config = old
        raise
    except Exception:
        try:
            await _apply(running, running.config, old, auth_settings)
        except Exception:  # the first error is the one to report
            log.exception("could not put the running config back after a failed reload")
        running.config = old
        raise
    return result


async def _apply(running: Running, old: Config, new: Config, auth_settings: AuthSettingsFor,
                 ) -> tuple[list[str], dict, dict]:
    router = running.router
    if router is None:
        raise RuntimeError("the gateway has not started; there is nothing to reload")
    router.authorizer.update(auth_settings(new))
    router.settings = dataclasses.replace(
        router.settings,
        keys=KeyPolicy(old.agent, new.sessions.group_sessions_per_user, new.sessions.thread_sessions_per_user),
        reset_policy_for=new.sessions.reset_policy_for,
    )
    restarted = []
    old_platforms = old.platforms.model_dump(mode="json")
    new_platforms = new.platforms.model_dump(mode="json")
    now_on = new.enabled_platforms()
    for name in installed_platforms():
        if (old_platforms.get(name) != new_platforms.get(name) or (name in running.adapters) != (now_on.get(name) == "on")
                or name in running.rejected_platforms):
            restarted.append(name)
    # Swap the config before touching adapters and cron: they are rebuilt from it.
    running.config = _keep_restart_only_values(old, new)
    for name in restarted:
        await running.restart_platform(name)
    cron = {}
    if running.cron is not None and old.cron != new.cron:
        cron = await running.cron.reload(running.config)
    tools = await running.mcp.reload(running.config.tools) if old.tools != new.tools else {}
    return restarted, cron, tools


def _keep_restart_only_values(old: Config, new: Config) -> Config:
    """``new`` for the live sections, ``old`` for everything that needs a restart."""
    return old.model_copy(update={section: getattr(new, section) for section in LIVE_SECTIONS})


__all__ = ["ReloadResult", "Running", "apply_reload", "changed_keys", "needs_restart", "reload_config"]
