"""Who may use which MCP tool: allow and deny globs over ``<server>__<tool>``, each where it applies.

    policy = ToolPolicy(config.tools)
    policy.offered("files__read_file", ctx)   # ctx: the turn's ToolContext (agent, platform, chat, user)

A tool is offered in a chat when an allow glob that applies there matches it and no deny glob that
applies there does: nothing is offered until allowed, and a deny always wins.  A server's own
``allow``/``deny`` apply everywhere; each entry of ``tools.rules`` applies where all of its
``agents``, ``platforms``, ``chats`` (``platform:chat_id``) and ``users`` (``platform:user_id``) match
(one it leaves out matches every value).

A scheduled job (platform ``cron``) is the exception for allows: it is offered only the tools its own
``tools`` globs name (the turn is handed those names), never what the allows of the servers and rules
give the chats; their denies still apply to it.

The agent's own tools (session search, memory, facts) are not governed here: a name without ``__`` is
always offered where the turn offers it.
"""

from __future__ import annotations

import fnmatch
from typing import Iterable

from gateway.config import ToolRule, ToolsConfig
from gateway.keys import chat_of_key
from gateway.tools import ToolContext

SEPARATOR = "__"
CRON = "cron"


def _matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def _applies(rule: ToolRule, ctx: ToolContext) -> bool:
    chat = chat_of_key(ctx.session_key)
    return ((rule.agents is None or ctx.agent in rule.agents)
            and (rule.platforms is None or ctx.platform in rule.platforms)
            and (rule.chats is None or (chat is not None and f"{ctx.platform}:{chat}" in rule.chats))
            and (rule.users is None or (ctx.user_id is not None and f"{ctx.platform}:{ctx.user_id}" in rule.users)))


class ToolPolicy:
    def __init__(self, cfg: ToolsConfig) -> None:
        self.servers = {name: s for name, s in cfg.mcp_servers.items()}
        self.rules = cfg.rules

    def offered(self, name: str, ctx: ToolContext) -> bool:
        """Whether ``name`` may be offered in ``ctx``'s chat (see the module's docstring)."""
        server_name, sep, tool = name.partition(SEPARATOR)
        if not sep or not tool:
            return True  # the agent's own tools
        server = self.servers.get(server_name)
        if server is None:
            return False
        rules = [r for r in self.rules if _applies(r, ctx)]
        if _matches(name, server.deny) or any(_matches(name, r.deny) for r in rules):
            return False
        if ctx.platform == CRON:
            return True  # its allows are its job's own ``tools``: the turn offers only those names
        return _matches(name, server.allow) or any(_matches(name, r.allow) for r in rules)


def reach(policy: ToolPolicy, name: str) -> str:
    """Where ``name`` is allowed, for the operator's listing: ``everywhere`` (an allow with no scope),
    ``some chats`` (only scoped rules allow it), or ``nowhere`` (denied everywhere, or never allowed).
    Scoped denies are not weighed: ``everywhere`` may still be denied in some chats."""
    server_name, _, _ = name.partition(SEPARATOR)
    server = policy.servers.get(server_name)
    if server is None or _matches(name, server.deny):
        return "nowhere"
    unscoped = [r for r in policy.rules if r.agents is r.platforms is r.chats is r.users is None]
    if any(_matches(name, r.deny) for r in unscoped):
        return "nowhere"
    if _matches(name, server.allow) or any(_matches(name, r.allow) for r in unscoped):
        return "everywhere"
    return "some chats" if any(_matches(name, r.allow) for r in policy.rules) else "nowhere"


def job_tools(globs: Iterable[str], registered: Iterable[str]) -> set[str]:
    """The MCP tools among ``registered`` a scheduled job's ``tools`` globs name."""
    globs = tuple(globs)
    return {n for n in registered if SEPARATOR in n and _matches(n, globs)}
