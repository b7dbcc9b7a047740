"""Each platform's library is an extra: the base install names no platform library, ``make test``
(the ``test`` extra) installs every one, and a platform turned on without its library is off with
the command that installs it, while the others run."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from gateway.config import config_from_dict, platform_models
from gateway.platforms import installed_platforms
from gateway.runtime.daemon import load_adapters

PYPROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
LIBRARIES = ("python-telegram-bot", "discord.py", "slack-bolt", "slack-sdk")


def test_every_built_in_platform_is_an_extra_and_the_test_extra_pulls_them_all_in():
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    shipped = set(project["entry-points"]["switchboard.adapter_configs"])
    assert shipped <= set(extras), "a platform without an extra of its own"
    assert set(extras["platforms"]) == {f"switchboard[{name}]" for name in shipped}
    assert "switchboard[platforms]" in extras["test"]
    assert not [d for d in project["dependencies"] if d.startswith(LIBRARIES)], "a platform library in the base install"


GHOST_CONFIG = '''
from typing import ClassVar

from gateway.config import PlatformConfig


class GhostConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "ghost"
    token: str = ""

    def credential_problem(self):
        return None if self.token else "platforms.ghost.token is not set"
'''


def test_a_platform_on_without_its_library_is_off_naming_the_extra_and_the_others_still_load(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "switchboard_ghost").mkdir(parents=True)
    (site / "switchboard_ghost" / "__init__.py").write_text("", encoding="utf-8")
    (site / "switchboard_ghost" / "config.py").write_text(GHOST_CONFIG, encoding="utf-8")
    (site / "switchboard_ghost" / "adapter.py").write_text("import ghost_sdk_that_is_not_installed\n", encoding="utf-8")
    dist = site / "switchboard_ghost-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: switchboard-ghost\nVersion: 1.0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        "[switchboard.adapters]\nghost = switchboard_ghost.adapter:GhostAdapter\n\n"
        "[switchboard.adapter_configs]\nghost = switchboard_ghost.config:GhostConfig\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    installed_platforms.cache_clear()
    platform_models.cache_clear()
    try:
        cfg = config_from_dict({"platforms": {"ghost": {"token": "t"}, "webhook": {"hooks": {"ci": {"secret": "s"}}}}},
                               env={})
        adapters, off = load_adapters(cfg, [])
    finally:
        for name in [m for m in sys.modules if m.startswith("switchboard_ghost")]:
            del sys.modules[name]
        installed_platforms.cache_clear()
        platform_models.cache_clear()
    assert off["ghost"] == ("off: its library is not installed (ghost_sdk_that_is_not_installed); install it with: "
                            "pip install 'switchboard[ghost]'")
    assert list(adapters) == ["webhook"]
