"""Every configured MCP server, and their allowed tools in the agent's tool registry.

    mcp = McpTools(config.tools, registry)
    mcp.start()          # one supervised client per enabled server (gateway.tools_mcp.server)
    mcp.catalog()        # every tool of every server, allowed or not, with its server's state
    mcp.listing(ctx)     # what /tools shows: what this chat may use
    await mcp.stop()

A server's tools (but those its own ``deny`` refuses everywhere) are registered as ``<server>__<tool>``
(the group ``mcp:<server>`` of the registry, replaced whenever its list changes), and the registry is
given the :class:`~gateway.tools_mcp.policy.ToolPolicy` of ``tools.rules`` and the servers' globs, so
the turn's tool loop offers each chat exactly the tools it may use, and runs them like the agent's own.  What a tool returns is untrusted text: it reaches the model only as that call's tool
message (which the turn stores, once, as the model saw it), cut at the server's ``max_output_bytes``.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from gateway.config import McpServerConfig, ToolsConfig
from gateway.tools import Tool, ToolContext, ToolRegistry
from gateway.tools_mcp.policy import ToolPolicy, reach
from gateway.tools_mcp.server import SEPARATOR, McpServer, McpTool, allowed

if TYPE_CHECKING:  # pragma: no cover
    from gateway.tools_mcp.signin import SignIns

AUTHORISE = "authorise"  # the one tool of a server nobody has signed in to yet: it sends the link


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    transport: str  # "stdio: <command>" or "http: <url>"
    state: str  # starting | ready | restarting | stopped
    last_error: str | None
    restarts: int
    tools: tuple[McpTool, ...]
    # where each tool is allowed (gateway.tools_mcp.policy.reach): everywhere | some chats | nowhere
    reach: Mapping[str, str] = field(default_factory=dict)
    protocol: str | None = None  # the MCP revision it speaks (2026-07-28, 2025-11-25, ...), once connected


class McpTools:
    def __init__(self, cfg: ToolsConfig, registry: ToolRegistry, *, signins: SignIns | None = None,
                 **server_options) -> None:
        self.registry = registry
        self.signins = signins  # OAuth sign-ins of the servers with auth: operator | per_user
        self.policy = ToolPolicy(cfg)
        registry.set_policy(self.policy.offered)
        self._server_options = server_options
        self.servers: dict[str, McpServer] = {}
        for name, server_cfg in cfg.mcp_servers.items():
            if server_cfg.enabled:
                self.servers[name] = self._server(name, server_cfg)

    def _server(self, name: str, cfg: McpServerConfig) -> McpServer:
        options = dict(self._server_options)
        if cfg.auth != "none":
            if self.signins is None:
                raise ValueError(f"tools.mcp_servers.{name} signs in (auth: {cfg.auth}), which needs the sign-ins "
                                 "(McpTools(signins=...))")
            options.update(auth=self.signins.auth_for(name, cfg), sign_in=self.signins.sign_in)
        return McpServer(name, cfg, on_change=functools.partial(self._register, name), **options)

    async def reload(self, cfg: ToolsConfig) -> dict[str, list[str]]:
        """Apply a reloaded ``tools`` section: the new rules at once; servers no longer enabled are
        stopped and their tools withdrawn, new ones started, and those whose settings changed stopped
        and started again with them (their calls running now end as if the server had stopped).
        Servers that did not change are left running.  Returns the names, by what was done."""
        self.policy = ToolPolicy(cfg)
        self.registry.set_policy(self.policy.offered)
        wanted = {name: c for name, c in cfg.mcp_servers.items() if c.enabled}
        done: dict[str, list[str]] = {"added": [], "restarted": [], "removed": []}
        for name in sorted(set(self.servers) | set(wanted)):
            server, new = self.servers.get(name), wanted.get(name)
            if server is not None and new is not None and server.cfg == new:
                continue
            if server is not None:
                await server.stop()
                del self.servers[name]
                self.registry.set_group(f"mcp:{name}", [])
            if new is not None:
                self.servers[name] = self._server(name, new)
                self.servers[name].start()
            done["added" if server is None else "restarted" if new is not None else "removed"].append(name)
        return done

    def start(self) -> None:
        for server in self.servers.values():
            server.start()

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers.values()))

    async def settled(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every server connected once or failed to."""
        waits = [server.settled.wait() for server in self.servers.values()]
        if waits:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=timeout)

    def catalog(self) -> list[ServerStatus]:
        """Every enabled server with every tool it offers (allowed or not, and where), by name."""
        out = []
        for name, server in sorted(self.servers.items()):
            cfg = server.cfg
            transport = f"http: {cfg.url}" if cfg.url else f"stdio: {cfg.command}"
            tools = tuple(t for _, t in sorted(server.tools.items()))
            out.append(ServerStatus(name, transport, server.state, server.last_error, server.restarts, tools,
                                    {t.full_name: reach(self.policy, t.full_name) for t in tools}, server.protocol))
        return out

    def find(self, full_name: str) -> tuple[McpServer, McpTool | None]:
        """The server and tool of ``<server>__<tool>``; KeyError when no enabled server has that name."""
        server_name, _, tool_name = full_name.partition(SEPARATOR)
        server = self.servers.get(server_name)
        if server is None or not tool_name:
            known = ", ".join(sorted(self.servers)) or "none is configured (tools.mcp_servers)"
            raise KeyError(f"{full_name!r} is not <server>__<tool> of an enabled MCP server (servers: {known})")
        return server, server.tools.get(tool_name)

    def listing(self, ctx: ToolContext) -> list[tuple[str, str, str | None]]:
        """What ``/tools`` shows: every tool the agent may be offered in ``ctx``'s chat (its own and the MCP
        ones allowed there), with the first line of its description and, for an MCP tool whose server is
        down, why it is unavailable."""
        out = []
        offered = self.registry.offered(ctx)
        for tool in self.registry.tools():
            if tool.name not in offered:
                continue
            server_name, sep, _ = tool.name.partition(SEPARATOR)
            server = self.servers.get(server_name) if sep else None
            unavailable = None
            if server is not None and not server.available and server.state != "unauthorised":
                unavailable = f"the {server_name} tool server is {'restarting' if server.state != 'stopped' else 'stopped'}"
            first = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
            approval = server.cfg.approval_for(tool.name.partition(SEPARATOR)[2]) if server is not None else "never"
            asks = {"always": " (asks for approval at each call)",
                    "once_per_session": " (asks for approval once per session)"}.get(approval, "")
            out.append((tool.name, first[:120] + asks, unavailable))
        return out

    def _register(self, name: str) -> None:
        server = self.servers[name]
        if server.state == "unauthorised" and not server.tools:  # nobody signed in: only the link can be asked for
            self.registry.set_group(f"mcp:{name}", [_authorise_tool(server)])
            return
        # every tool its own deny leaves: which chat may use one is the policy's to say, per turn
        self.registry.set_group(f"mcp:{name}", [_as_tool(server, t) for t in server.tools.values()
                                                if allowed(t.full_name, ("*",), server.cfg.deny)])


def _authorise_tool(server: McpServer) -> Tool:
    async def run(ctx: ToolContext, args: dict) -> str:
        return await server.authorise(ctx)

    who = "the operator" if server.auth is not None and server.auth.mode == "operator" else "the user"
    return Tool(f"{server.name}{SEPARATOR}{AUTHORISE}",
                f"The {server.name} tool server needs {who} to sign in before its tools can be used. Call this "
                f"when the user wants something from {server.name}: it sends them a sign-in link.",
                {"type": "object", "properties": {}}, run)


def _as_tool(server: McpServer, tool: McpTool) -> Tool:
    async def run(ctx: ToolContext, args: dict) -> str:
        return await server.call(tool.name, args, ctx)

    description = tool.description or f"The {tool.name} tool of the {server.name} MCP server."
    return Tool(tool.full_name, description, tool.parameters, run)
