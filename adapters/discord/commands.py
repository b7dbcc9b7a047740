"""The gateway's commands as Discord slash commands.

Each command takes one optional string option, ``args``, so ``/title Trip``
reaches the gateway as ``/title Trip``.  Registration is global (``PUT
/applications/{id}/commands``) and skipped when Discord already has exactly
these commands: Discord limits how often commands may be created.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import discord
from discord import app_commands

from .redact import describe

log = logging.getLogger(__name__)

ARGS_HELP = "Arguments (optional)"
OnCommand = Callable[[discord.Interaction, str, "str | None"], Awaitable[None]]


def _signature(payloads: list[dict]) -> set[tuple]:
    return {
        (p["name"], p.get("description", ""),
         tuple((o["name"], o["type"], bool(o.get("required")), o.get("description", "")) for o in p.get("options") or ()))
        for p in payloads
    }


async def sync_commands(client: discord.Client, tree: app_commands.CommandTree) -> None:
    """Register the global slash commands, unless Discord already has exactly these (it limits re-creation)."""
    app_id = client.application_id
    have = await client.http.get_global_commands(app_id)
    want = [cmd.to_dict(tree) for cmd in tree.get_commands()]
    if _signature(have) == _signature(want):
        log.debug("discord: slash commands already registered")
        return
    await tree.sync()
    log.info("discord: registered %d slash commands", len(want))


def slash_command(on_command: OnCommand, name: str, description: str) -> app_commands.Command:
    @app_commands.describe(args=ARGS_HELP)
    async def callback(interaction: discord.Interaction, args: str | None = None) -> None:
        await on_command(interaction, name, args)

    return app_commands.Command(name=name, description=(description or name)[:100], callback=callback)


async def tell(interaction: discord.Interaction, name: str, text: str) -> None:
    """An ephemeral follow-up (only the user sees it), best effort."""
    try:
        await interaction.followup.send(text, ephemeral=True)
    except discord.HTTPException as exc:
        log.warning("discord: could not answer /%s: %s", name, describe(exc))
