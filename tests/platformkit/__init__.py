"""The platform conformance kit: one suite (tests/test_platform_kit.py) every installed platform passes.

    from tests.platformkit import FakePlatform, Sent, fake_for, kit_platforms

A platform takes part by having a fake that implements :class:`FakePlatform` (see ``contract``):
the built-in ones are listed in :data:`BUILT_IN_FAKES`; a platform package shipped on its own
publishes its fake under the ``switchboard.platform_fakes`` entry point (``name = module:Class``),
next to its ``switchboard.adapters`` and ``switchboard.adapter_configs`` ones.  Its capabilities
come from its settings model (``PlatformConfig.CAPABILITIES``).  docs/platforms.md is the guide.

It lives under ``tests/`` (not in the installed package) because it runs the real gateway against
the fake model and the crash harness (tests/fakes/model_server.py, tests/crashkit.py), which have no
place in a production install; a platform package's own tests run it from a Switchboard checkout.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from gateway.platforms import installed_platforms

from .contract import USERS, FakePlatform, NotApplicable, Sent

__all__ = ["BUILT_IN_FAKES", "FAKES", "USERS", "FakePlatform", "NotApplicable", "Sent", "fake_for",
           "kit_platforms", "without_fake"]

FAKES = "switchboard.platform_fakes"
BUILT_IN_FAKES = {
    "telegram": "tests.platformkit.telegram:TelegramKit",
    "discord": "tests.platformkit.discord:DiscordKit",
    "slack": "tests.platformkit.slack:SlackKit",
    "email": "tests.platformkit.email:EmailKit",
    "webhook": "tests.platformkit.webhook:WebhookKit",
    "matrix": "tests.platformkit.matrix:MatrixKit",
    "whatsapp": "tests.platformkit.whatsapp:WhatsAppKit",
    "signal": "tests.platformkit.signal:SignalKit",
    "teams": "tests.platformkit.teams:TeamsKit",
    "lark": "tests.platformkit.lark:LarkKit",
}


def _fakes() -> dict[str, str]:
    found = dict(BUILT_IN_FAKES)
    found.update({ep.name: ep.value for ep in entry_points(group=FAKES)})
    return found


def kit_platforms() -> list[str]:
    """The installed platforms that have a fake, in the usual platform order."""
    fakes = _fakes()
    return [name for name in installed_platforms() if name in fakes]


def without_fake() -> list[str]:
    """Installed platforms nobody wrote a fake for (the suite fails naming them)."""
    fakes = _fakes()
    return [name for name in installed_platforms() if name not in fakes]


def fake_for(name: str) -> FakePlatform:
    """A new (not yet started) fake of platform ``name``."""
    module, _, cls = _fakes()[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
