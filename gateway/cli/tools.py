"""``switchboard tools``: list, show, call the tools of the configured MCP servers, without a chat.

Each command starts the servers of ``tools.mcp_servers`` itself (as the daemon does: the same clean
environment for stdio servers, the same allow and deny rules, timeout and output cap), waits for
them to answer, does its one thing and stops them.  Only the ``tools`` section of the config is
read, so an unset ``${TOKEN}`` elsewhere in the file stops nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import click
from rich.table import Table

from gateway.cli.common import config_keys, console, home_options, json_option, json_out
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools, ServerStatus
from gateway.tools_mcp.policy import reach

T = TypeVar("T")
WAIT_HELP = "Seconds to wait for the servers to start and answer."


NO_SERVER = ("No MCP server is configured (tools.mcp_servers in the config; see config.example.yaml). "
             "The built-in tools need none: session_search, memory and, with facts on, facts "
             "(/tools in a chat lists what it may use).")


def _with_servers(config_path: Path | None, wait: float, work: Callable[[McpTools], Awaitable[T]]) -> T:
    cfg = config_keys(config_path, "tools")
    if not cfg.tools.mcp_servers:
        raise click.ClickException(NO_SERVER)
    logging.getLogger("gateway.tools_mcp").setLevel(logging.ERROR)  # a server that fails is shown in the output

    async def run() -> T:
        tools = McpTools(cfg.tools, ToolRegistry())
        tools.start()
        try:
            await tools.settled(wait)
            return await work(tools)
        finally:
            await tools.stop()

    return asyncio.run(run())


def _server_row(status: ServerStatus) -> dict[str, Any]:
    return {"server": status.name, "transport": status.transport, "state": status.state,
            "protocol": status.protocol, "last_error": status.last_error,
            "tools": [{"name": t.full_name, "offered": status.reach.get(t.full_name) == "everywhere",
                       "offered_in": status.reach.get(t.full_name, "nowhere"), "description": t.description}
                      for t in status.tools]}


@click.group("tools")
def tools_group() -> None:
    """The tools of the MCP servers (tools.mcp_servers): see them and try them without a chat."""


@tools_group.command("list")
@home_options
@click.option("--wait", type=click.FloatRange(min=0), default=15.0, show_default=True, help=WAIT_HELP)
@json_option("Print JSON for scripts.")
def list_cmd(config_path: Path | None, wait: float, as_json: bool) -> None:
    """Every tool of every server, and whether the model is offered it: everywhere (yes), only in some
    chats (tools.rules), or nowhere (no)."""
    async def work(tools: McpTools) -> list[ServerStatus]:
        return tools.catalog()

    if not config_keys(config_path, "tools").tools.mcp_servers:  # nothing to start: not an error
        if as_json:
            json_out([])
        else:
            click.echo(NO_SERVER)
        return
    catalog = _with_servers(config_path, wait, work)
    if as_json:
        json_out([_server_row(s) for s in catalog])
        return
    table = Table(box=None, header_style="bold")
    for name in ("Tool", "Offered"):
        table.add_column(name, no_wrap=True)
    table.add_column("Description", max_width=70, overflow="ellipsis", no_wrap=True)
    for status in catalog:
        for tool in status.tools:
            first = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
            table.add_row(tool.full_name, _OFFERED[status.reach.get(tool.full_name, "nowhere")], first)
    if any(s.tools for s in catalog):
        console().print(table)
    for status in catalog:
        if status.state != "ready":
            click.echo(f"server {status.name} ({status.transport}) is not answering: "
                       f"{status.last_error or status.state}", err=True)
    if not any(s.tools for s in catalog):
        click.echo("No tools: no server answered." if all(s.state != "ready" for s in catalog)
                   else "The servers offer no tools.")


_APPROVAL = {"never": "none: the model calls it directly",
             "always": "always: each call waits for a yes (the chat's buttons or /approve)",
             "once_per_session": "once per session: the first call in a session waits for a yes"}
_OFFERED = {"everywhere": "yes", "some chats": "some chats", "nowhere": "no"}


def _find(tools: McpTools, name: str):
    try:
        server, tool = tools.find(name)
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    if not server.available:
        raise click.ClickException(f"the {server.name} server is not answering: {server.last_error or server.state}")
    if tool is None:
        known = ", ".join(sorted(t.full_name for t in server.tools.values())) or "none"
        raise click.ClickException(f"the {server.name} server has no tool {name!r} (its tools: {known})")
    return server, tool


@tools_group.command("show")
@home_options
@click.argument("name", metavar="SERVER__TOOL")
@click.option("--wait", type=click.FloatRange(min=0), default=15.0, show_default=True, help=WAIT_HELP)
@json_option("Print the tool as JSON.")
def show_cmd(config_path: Path | None, name: str, wait: float, as_json: bool) -> None:
    """One tool: whether it is offered, its description and the arguments it takes (JSON schema)."""
    async def work(tools: McpTools):
        return (*_find(tools, name), reach(tools.policy, name))

    server, tool, where = _with_servers(config_path, wait, work)
    if as_json:
        json_out({"name": tool.full_name, "server": server.name, "offered": where == "everywhere",
                  "approval": server.cfg.approval_for(tool.name),
                  "offered_in": where, "description": tool.description, "parameters": tool.parameters})
        return
    cfg = server.cfg
    click.echo("\n".join([
        f"Tool        {tool.full_name}",
        f"Server      {server.name} ({f'http: {cfg.url}' if cfg.url else f'stdio: {cfg.command}'})",
        "Offered     " + {"everywhere": "yes",
                              "some chats": "in some chats (tools.rules; /tools in a chat shows what it may use)",
                              }.get(where, f"no: allow it with a glob under tools.mcp_servers.{server.name}.allow "
                                           f"or tools.rules"),
        "Approval    " + _APPROVAL[cfg.approval_for(tool.name)],
        f"Limits      {cfg.timeout_seconds:g} s per call, results cut at {cfg.max_output_bytes:,} bytes, "
        f"{cfg.max_concurrent_calls} at once",
        "",
        tool.description or "(no description)",
        "",
        "Arguments (JSON schema):",
        json.dumps(tool.parameters, ensure_ascii=False, indent=2),
    ]))


@tools_group.command("call")
@home_options
@click.argument("name", metavar="SERVER__TOOL")
@click.argument("arguments", metavar="[JSON]", default="{}")
@click.option("--wait", type=click.FloatRange(min=0), default=15.0, show_default=True, help=WAIT_HELP)
def call_cmd(config_path: Path | None, name: str, arguments: str, wait: float) -> None:
    """Run one tool with JSON arguments and print what the model would read (exit 1 when it is an error).

    Any tool of a configured server may be tried here, offered to the model or not.
    """
    try:
        args = json.loads(arguments)
    except ValueError as exc:
        raise click.ClickException(f"the arguments are not JSON ({exc}); write them like '{{\"path\": \"a.txt\"}}'") from None
    if not isinstance(args, dict):
        raise click.ClickException("the arguments must be a JSON object, like '{\"path\": \"a.txt\"}'")

    async def work(tools: McpTools) -> tuple[bool, str]:
        server, tool = _find(tools, name)
        return reach(tools.policy, name) != "nowhere", await server.call(tool.name, args)

    offered, result = _with_servers(config_path, wait, work)
    if not offered:
        click.echo(f"note: {name} is not offered to the model (no allow glob matches it, or a deny glob does)",
                   err=True)
    click.echo(result)
    if result.startswith("error:"):
        raise SystemExit(1)
