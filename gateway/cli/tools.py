"""``switchboard tools``: list, show, call the tools of the configured MCP servers, without a chat;
sign in to a server that needs it (``login``) and out (``logout``).

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

import state
from gateway.cli.common import config_keys, console, home_options, json_option, json_out, resolve_home, resolve_store
from gateway.tools import ToolRegistry
from gateway.tools_mcp import McpTools, ServerStatus
from gateway.tools_mcp.oauth import OPERATOR, AuthError
from gateway.tools_mcp.policy import reach
from gateway.tools_mcp.signin import SignIns, oauth_settings

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
        db, signins = _signins(config_path) if any(s.auth != "none" for s in cfg.tools.mcp_servers.values()) \
            else (None, None)
        tools = McpTools(cfg.tools, ToolRegistry(), signins=signins)
        tools.start()
        try:
            await tools.settled(wait)
            return await work(tools)
        finally:
            await tools.stop()
            if db is not None:
                await db.close()

    return asyncio.run(run())


def _signins(config_path: Path | None) -> tuple[state.AsyncSessionDB, SignIns]:
    """The sign-ins the daemon keeps (the store and the key in the home), for the CLI to read and change."""
    cfg = config_keys(config_path, "tools", "api")
    try:
        db = state.AsyncSessionDB(state.SessionDB(resolve_store(config_path)))
    except state.StateError as exc:
        raise click.ClickException(str(exc)) from None
    return db, SignIns(db, resolve_home(config_path), oauth_settings(cfg))


def _signing_server(config_path: Path | None, name: str):
    cfg = config_keys(config_path, "tools")
    server = cfg.tools.mcp_servers.get(name)
    signing = sorted(n for n, s in cfg.tools.mcp_servers.items() if s.auth != "none")
    if server is None or server.auth == "none":
        raise click.ClickException(f"{name!r} is not an MCP server that signs in (auth: operator | per_user); "
                                   f"those that do: {', '.join(signing) or 'none'}")
    return server


def _principal(mode: str, user: str | None) -> str:
    if mode == "operator":
        if user:
            raise click.ClickException("this server uses the operator's one sign-in; --user is for auth: per_user")
        return OPERATOR
    if not user or ":" not in user:
        raise click.ClickException("this server signs in per user: name whose sign-in, --user PLATFORM:USER_ID "
                                   "(e.g. telegram:123456789)")
    return user


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


@tools_group.command("login")
@home_options
@click.argument("server", metavar="SERVER")
@click.option("--user", metavar="PLATFORM:USER_ID", help="Whose sign-in (a per_user server); else the operator's.")
def login_cmd(config_path: Path | None, server: str, user: str | None) -> None:
    """Print a sign-in link for SERVER (auth: operator, or --user for per_user).

    Open it in a browser; the running daemon's local API receives the authorisation server's answer
    (tools.oauth.public_url, else http://127.0.0.1:<api.port>) and keeps the tokens.
    """
    cfg = _signing_server(config_path, server)
    principal = _principal(cfg.auth, user)

    async def run() -> str:
        db, signins = _signins(config_path)
        try:
            auth = signins.auth_for(server, cfg)
            assert auth is not None
            return await auth.begin(principal)
        finally:
            await db.close()

    try:
        link = asyncio.run(run())
    except AuthError as exc:
        raise click.ClickException(f"the sign-in to {server} could not be started: {exc}") from None
    click.echo(f"Open this link to sign {'in for everyone' if principal == OPERATOR else principal + ' in'} "
               f"to {server} (it works for 15 minutes; the daemon must be running to receive the answer):")
    click.echo(link)


@tools_group.command("logout")
@home_options
@click.argument("server", metavar="SERVER")
@click.option("--user", metavar="PLATFORM:USER_ID", help="Whose sign-in (a per_user server).")
@click.option("--all", "everyone", is_flag=True, help="Every sign-in to SERVER (a per_user server: everyone's).")
def logout_cmd(config_path: Path | None, server: str, user: str | None, everyone: bool) -> None:
    """Sign out of SERVER: its tokens deleted from the store and revoked where the server allows it."""
    cfg = _signing_server(config_path, server)
    principal = None if everyone else _principal(cfg.auth, user)

    async def run() -> int:
        db, signins = _signins(config_path)
        try:
            signins.auth_for(server, cfg)
            return await signins.logout(server, principal)
        finally:
            await db.close()

    gone = asyncio.run(run())
    who = "everyone" if principal is None else ("the operator" if principal == OPERATOR else principal)
    if not gone:
        click.echo(f"{server}: no sign-in of {who} to remove.")
        return
    click.echo(f"{server}: signed out {who} ({gone} sign-in{'s' if gone != 1 else ''} deleted and revoked where "
               "the server allows it).")
