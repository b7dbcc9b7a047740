"""What every ``switchboard`` command shares: ``--config`` and ``--home``, one-line errors, finding the home.

Every subcommand takes ``--config FILE`` and ``--home DIR`` after its name
(``switchboard sessions list --home DIR``), and every one finds its home
through :func:`resolve_home`, so the daemon, the CLI and cron runs always
open the same ``state.db``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, NoReturn

import click
from rich.console import Console

import state
from gateway import _config_load
from gateway.config import Config, config_from_dict, load_config
from gateway.errors import ConfigError

_HOME_KEY = "switchboard.home"
_CONFIG_KEY = "switchboard.config"

_CONFIG_HELP = ("Config file (default: $SWITCHBOARD_CONFIG, else $SWITCHBOARD_HOME/config.yaml, else "
                "~/.switchboard/config.yaml, else the checkout's config.example.yaml).")
_HOME_HELP = ("The home holding state.db (default: the config file's home:, else $SWITCHBOARD_HOME, "
              "else ~/.switchboard).")


def remember_home(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta[_HOME_KEY] = value


def home_options(func):
    """Add ``--config`` (passed as ``config_path``) and ``--home`` (read by :func:`resolve_home`)."""
    func = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
                        expose_value=False, callback=remember_home, help=_HOME_HELP)(func)
    return click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
                        help=_CONFIG_HELP)(func)


class InstalledChoice(click.Choice):
    """A ``click.Choice`` read when first used, not at import: ``choices()`` names them (the installed
    platforms, and for ``--source`` the local sources too), so a platform installed as its own package
    is a choice like a built-in one.  Any case is accepted (``Telegram`` means ``telegram``)."""

    def __init__(self, choices: Callable[[], tuple[str, ...]]) -> None:
        self._choices_now = choices
        self.case_sensitive = False

    @property
    def choices(self) -> tuple[str, ...]:
        return self._choices_now()

    @choices.setter
    def choices(self, value: tuple[str, ...]) -> None:
        self._choices_now = lambda: tuple(value)


def with_store(command: Callable[..., Any]) -> Callable[..., Any]:
    """Take --config and --home, open the store of that home for the command (its first argument),
    close it after, and turn a StateError into one line."""

    @functools.wraps(command)
    def run(*args: Any, config_path: Path | None = None, **kwargs: Any) -> Any:
        db = None
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.meta[_CONFIG_KEY] = config_path  # for resolve_media, in the command
        try:
            db = state.SessionDB(resolve_store(config_path))
            return command(db, *args, **kwargs)
        except state.StateError as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            if db is not None:
                db.close()

    return home_options(run)


_JSON_KEY = "switchboard.json"


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_JSON_KEY] = True
    return value


def json_option(help_text: str = "Print JSON for scripts.") -> Callable[[Any], Any]:
    """``--json`` (passed as ``as_json``); eager, so an error in any other option is reported as JSON too."""
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_remember_json, help=help_text)


def _json_asked(ctx: click.Context | None) -> bool:
    return ctx is not None and bool(ctx.meta.get(_JSON_KEY))


class _JsonError(click.ClickException):
    """An error of a ``--json`` command, shown as ``{"error": ...}`` on stderr with its exit code."""

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(error.format_message())
        self.exit_code = error.exit_code  # type: ignore[misc]  # a ClassVar in click; this one keeps the original code

    def show(self, file: Any = None) -> None:
        click.echo(json.dumps({"error": self.message}, ensure_ascii=False), err=True)


class Switchboard(click.Group):
    """The ``switchboard`` group: under ``--json`` every command's error is ``{"error": "..."}`` on stderr,
    with the exit code it has without ``--json`` (the one place this is decided; :func:`fail` agrees)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # an unknown option stops parsing before --json is read: a "--json" among the words asks for JSON too
        words = args[:args.index("--")] if "--" in args else args
        if "--json" in words:
            ctx.meta[_JSON_KEY] = True
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if _json_asked(ctx):
                raise _JsonError(exc) from exc
            raise


def json_out(value: Any) -> None:
    """One JSON document on stdout, for ``--json``."""
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))


def console() -> Console:
    """A rich console for tables: the terminal's width, or 160 columns into a pipe."""
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def when(ts: float | None) -> str:
    """A stored time as local ``YYYY-MM-DD HH:MM:SS``; ``-`` for none."""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def plural(count: int, noun: str) -> str:
    """``1 session``, ``2 sessions``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one line on stderr (``{"error": ...}`` under ``--json``) and exit with ``code``."""
    if _json_asked(click.get_current_context(silent=True)):
        click.echo(json.dumps({"error": message}, ensure_ascii=False), err=True)
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(code)


def given_home() -> Path | None:
    """The ``--home`` given to the running command, if any."""
    ctx = click.get_current_context(silent=True)
    value = ctx.meta.get(_HOME_KEY) if ctx is not None else None
    return Path(value).expanduser().absolute() if value is not None else None


def resolve_home(config_path: Path | None = None) -> Path:
    """The home the operator means, the same for every command.

    ``--home`` when given; else the ``home:`` of the config file (``--config``,
    else ``$SWITCHBOARD_CONFIG``, else ``$SWITCHBOARD_HOME/config.yaml``, else
    ``~/.switchboard/config.yaml``), whose default is ``$SWITCHBOARD_HOME``;
    else ``$SWITCHBOARD_HOME``, else ``~/.switchboard``.  Only the file's
    ``home:`` key is read, so a ``${TOKEN}`` the shell does not export does
    not stop ``sessions list``.  A ``--config`` file that does not exist, or
    a ``home:`` that does not validate, exits 78 naming it.
    """
    explicit = given_home()
    if explicit is not None:
        return explicit
    found = _config_file(config_path)
    if found is None:
        return state.default_home()
    path, source = found
    shown = str(path)
    try:
        data = _config_load.parse_yaml(_config_load.read_text(path, source), shown)
        value = data.get("home")
        home = _config_load.expand_env({"home": value}, os.environ, shown)["home"] if value else None
        return config_from_dict({"home": home}, base_dir=path.resolve().parent).home
    except ConfigError as exc:
        fail(str(exc) if exc.file else f"{shown}: {exc}", exc.exit_code)
        raise  # unreachable


def config_keys(config_path: Path | None, *keys: str) -> Config:
    """The config with only ``keys`` read from its file (every other setting its default), so that
    a ``${TOKEN}`` the shell does not export does not stop a command that needs, say, ``pricing``
    only; a bad value under ``keys`` exits 78 naming the file and key."""
    found = _config_file(config_path)
    if found is None:
        return config_from_dict({})
    path, source = found
    shown = str(path)
    try:
        data = _config_load.parse_yaml(_config_load.read_text(path, source), shown)
        part = _config_load.expand_env({key: data[key] for key in keys if key in data}, os.environ, shown)
        return config_from_dict(part, base_dir=path.resolve().parent)
    except ConfigError as exc:
        fail(str(exc) if exc.file else f"{shown}: {exc}", exc.exit_code)
        raise  # unreachable


def resolve_store(config_path: Path | None = None) -> Path | str:
    """The store the operator means: the config file's ``store.url`` when set (PostgreSQL), else
    ``state.db`` in :func:`resolve_home`.  Only that key is read (:func:`config_keys`), so an unset
    ``${TOKEN}`` elsewhere stops nothing; a bad ``store.url`` exits 78 naming it."""
    url = config_keys(config_path, "store").store.url
    return url if url else resolve_home(config_path) / "state.db"


def resolve_media(config_path: Path | None = None) -> Path:
    """The media folder the operator means: ``media.path`` of the config file, else ``media`` in
    :func:`resolve_home` (inside a :func:`with_store` command, the ``--config`` it was given)."""
    if config_path is None:
        ctx = click.get_current_context(silent=True)
        config_path = ctx.meta.get(_CONFIG_KEY) if ctx is not None else None
    return config_keys(config_path, "media").media.path or resolve_home(config_path) / "media"


def forget_media(db: state.SessionDB, doomed: set[str]) -> None:
    """After sessions were deleted: delete the files only they referred to (``doomed``: their hashes),
    and any other file nothing refers to any more (older than the sweep's grace period)."""
    from state.media_files import MediaFiles

    swept = MediaFiles(resolve_media()).sweep(db.media.referenced(), doomed=doomed)
    if swept.files:
        click.echo(f"deleted {plural(swept.files, 'media file')} ({swept.bytes:,} bytes) no message refers to any more")


def refuse_on_postgresql(config_path: Path | None, what: str, instead: str) -> None:
    """Stop a command that works on the SQLite file (backup, restore, maintenance) when ``store.url``
    points at PostgreSQL, saying what to use instead."""
    target = resolve_store(config_path)
    if isinstance(target, str):
        raise click.ClickException(f"store.url points at PostgreSQL ({state.mask_url(target)}): {what} works on "
                                   f"a SQLite state.db; {instead}")


def _config_file(config_path: Path | None) -> tuple[Path, str] | None:
    """The config file in use and how it was found: ``--config`` (which must exist), else the one found, else None."""
    path, source = _config_load.locate(config_path, os.environ)
    if config_path is not None or path.is_file():
        return path, source
    return None


def with_given_home(cfg: Config) -> Config:
    """``cfg`` with ``--home`` in place of its home, when given (the file's home: is already in ``cfg``)."""
    home = given_home()
    return cfg if home is None or home == cfg.home else cfg.model_copy(update={"home": home})


def load_config_or_exit(config_path: Path | None) -> Config:
    """The config (its home as :func:`resolve_home` says), or exit 78 with the message naming the file and key."""
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        fail(str(exc), exc.exit_code)
        raise  # unreachable
    return with_given_home(cfg)


def config_or_defaults(config_path: Path | None) -> Config:
    """The config file's settings; with no file anywhere, the defaults (home as :func:`resolve_home` says)."""
    if _config_file(config_path) is None:
        return with_given_home(config_from_dict({}))
    return load_config_or_exit(config_path)

