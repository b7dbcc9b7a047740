"""The tool registry: functions the model may call (OpenAI function calling).

Later features (session search, memory, facts) register their tools here;
the agent turn offers ``registry.schemas()`` to the model and runs each call
with :meth:`ToolRegistry.call`, which turns any failure into a text result the
model can read, so a broken tool never breaks a turn.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the turn that called it."""

    session_id: str
    session_key: str
    platform: str
    user_id: str | None
    agent: str
    extra: dict = field(default_factory=dict)


ToolHandler = Callable[[ToolContext, dict], Awaitable[str]]
# Whether a tool may be offered in a turn's chat (gateway.tools_mcp.policy.ToolPolicy.offered).
ToolPolicy = Callable[[str, ToolContext], bool]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    handler: ToolHandler

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._groups: dict[str, set[str]] = {}  # tools that come and go together (one MCP server's)
        self._policy: ToolPolicy = lambda name, ctx: True

    def set_policy(self, policy: ToolPolicy) -> None:
        """Who may be offered what (the MCP tools' allow and deny rules); replaced on a reload."""
        self._policy = policy

    def offered(self, ctx: ToolContext, only: set[str] | None = None) -> set[str]:
        """The names a turn in ``ctx``'s chat may be offered: registered, among ``only`` (None: all),
        and allowed there by the policy."""
        return {n for n in self._tools if (only is None or n in only) and self._policy(n, ctx)}

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def set_group(self, group: str, tools: list[Tool]) -> None:
        """Make ``tools`` the whole of ``group``: tools of it that are not among them are removed."""
        mine = self._groups.get(group, set())
        taken = [t.name for t in tools if t.name in self._tools and t.name not in mine]
        if taken:
            raise ValueError(f"tool(s) {', '.join(map(repr, taken))} are already registered outside {group}")
        for name in mine:
            del self._tools[name]
        for tool in tools:
            self._tools[tool.name] = tool
        self._groups[group] = {t.name for t in tools}

    def names(self) -> list[str]:
        return sorted(self._tools)

    def tools(self) -> list[Tool]:
        """Every registered tool, by name."""
        return [tool for _, tool in sorted(self._tools.items())]

    def schemas(self, only: set[str] | None = None) -> list[dict]:
        return [t.schema() for n, t in sorted(self._tools.items()) if only is None or n in only]

    async def call(self, name: str, arguments: str | None, ctx: ToolContext) -> str:
        tool = self._tools.get(name)
        if tool is None:
            return f"error: there is no tool named {name!r}; available: {', '.join(self.names()) or 'none'}"
        try:
            args: Any = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return f"error: arguments for {name} are not valid JSON ({exc})"
        try:
            return await tool.handler(ctx, args)
        except Exception as exc:  # the model reads the failure as the tool's result
            log.warning("tool %s failed: %s", name, exc, exc_info=True)
            return f"error: {name} failed: {exc}"
