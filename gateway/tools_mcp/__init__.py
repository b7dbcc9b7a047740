"""MCP tool servers (``tools.mcp_servers``): supervised clients whose allowed tools the agent can call.

:mod:`.server` keeps one server connected and restarts it with backoff; :mod:`.manager` registers the
allowed tools of every server in the agent's :class:`~gateway.tools.ToolRegistry` as
``<server>__<tool>``; :mod:`.environment` gives a stdio server exactly its ``env`` plus PATH and HOME,
which :mod:`.stdio` (the transport) hands it;
:mod:`.results` turns a result into the capped text the model reads.
"""

from gateway.tools_mcp.manager import McpTools, ServerStatus
from gateway.tools_mcp.server import McpServer, McpTool, allowed

__all__ = ["McpServer", "McpTool", "McpTools", "ServerStatus", "allowed"]
