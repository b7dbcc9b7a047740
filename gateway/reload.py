"""SIGHUP: re-read the config and apply what can change without dropping a conversation.

Applied live: ``auth`` and ``platforms.<p>.allowed_users`` (allowlists),
``sessions`` (reset policies, key policy for new keys), ``platforms``
(tokens and settings: a changed platform's adapter alone is restarted, a
platform turned on is started, one turned off is stopped), ``cron.jobs``
and ``shutdown``.  Everything else (``home``, ``agent``, ``model``, ``api``,
``logging``, ``store``, ...) is reported as needing a restart; the running
values stay in force.  A config that does not validate changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging

from gateway.config import PLATFORMS, Config
from gateway.keys import KeyPolicy

log = logging.getLogger(__name__)

LIVE_SECTIONS = ("auth", "sessions", "platforms", "cron", "shutdown")


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


async def apply_reload(gw, new: Config, auth_settings) -> dict:
    """Apply ``new`` to the running gateway ``gw``; returns what changed and what needs a restart."""
    old: Config = gw.config
    restart = needs_restart(old, new)
    router = gw.router
    router.authorizer.update(auth_settings(new))
    router.settings = dataclasses.replace(
        router.settings,
        keys=KeyPolicy(old.agent, new.sessions.group_sessions_per_user, new.sessions.thread_sessions_per_user),
        reset_policy_for=new.sessions.reset_policy_for,
    )
    restarted = []
    old_platforms = old.platforms.model_dump(mode="json")
    new_platforms = new.platforms.model_dump(mode="json")
    for name in PLATFORMS:
        if old_platforms[name] != new_platforms[name] or (name in gw.adapters) != (new.enabled_platforms()[name] == "on"):
            restarted.append(name)
    # Swap the config before touching adapters: they are rebuilt from it.
    gw.config = _keep_restart_only_values(old, new)
    for name in restarted:
        await gw.restart_platform(name)
    if getattr(gw, "cron", None) is not None and old.cron != new.cron:
        await gw.cron.reload()
    log.info("config reloaded: platforms restarted: %s; needs a restart to apply: %s",
             ", ".join(restarted) or "none", ", ".join(restart) or "nothing")
    return {"restarted_platforms": restarted, "needs_restart": restart}


def _keep_restart_only_values(old: Config, new: Config) -> Config:
    """``new`` for the live sections, ``old`` for everything that needs a restart."""
    return old.model_copy(update={section: getattr(new, section) for section in LIVE_SECTIONS})


__all__ = ["apply_reload", "changed_keys", "needs_restart"]
