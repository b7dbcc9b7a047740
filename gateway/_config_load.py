"""Reading the config file: locating it, parsing YAML, expanding ``${VAR}``,
and turning pydantic's errors into one :class:`~gateway.errors.ConfigError`.

Private to :mod:`gateway.config`; the models live there and are passed in, so
this module knows nothing about which keys exist.  A model whose keys are known
only at run time (the installed platforms) names the model that really
validates it through a classmethod ``concrete_model()``, and may add a word on
unknown keys in a ``UNKNOWN_KEY_HELP`` class attribute.
"""

from __future__ import annotations

import collections.abc
import difflib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from gateway.errors import ConfigError, SwitchboardError

Loc = tuple[str | int, ...]


class KeyedError(SwitchboardError, ValueError):
    """Raised by a model validator to blame one key below the model being validated.

    Pydantic gives a model-level validator's error the model's own location;
    the translator below appends ``key`` so the operator sees the exact key.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


# --------------------------------------------------------------------------- locating


def example_config() -> Path | None:
    """The source tree's ``config.example.yaml``, the file ``make run`` starts the gateway with, when
    this Switchboard runs from a checkout (an editable install); None when installed elsewhere."""
    path = Path(__file__).resolve().parent.parent / "config.example.yaml"
    return path if path.is_file() else None


def locate(explicit: str | Path | None, env: Mapping[str, str]) -> tuple[Path, str]:
    """The config path and a phrase saying where that choice came from.

    With none of ``--config``, ``SWITCHBOARD_CONFIG``, ``SWITCHBOARD_HOME`` given and no
    ``~/.switchboard/config.yaml``, a checkout's ``config.example.yaml`` is the only config around,
    and the one ``make run`` used: every command finds it, so the quick start's next steps work."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser(), "given with --config"
    if env.get("SWITCHBOARD_CONFIG"):
        return Path(env["SWITCHBOARD_CONFIG"]).expanduser(), "named by $SWITCHBOARD_CONFIG"
    if env.get("SWITCHBOARD_HOME"):
        return Path(env["SWITCHBOARD_HOME"]).expanduser() / "config.yaml", "looked in $SWITCHBOARD_HOME"
    default = Path("~/.switchboard/config.yaml").expanduser()
    example = example_config()
    if example is not None and not default.exists():
        return example, ("the checkout's example, which `make run` uses: none of --config, SWITCHBOARD_CONFIG, "
                         "SWITCHBOARD_HOME is set and there is no ~/.switchboard/config.yaml")
    return (
        default,
        "looked in the default home ~/.switchboard: none of --config, SWITCHBOARD_CONFIG, SWITCHBOARD_HOME is set",
    )


def missing_config_fix() -> str:
    """What to do when no config file is found: the checkout's example (``make run``'s) by name, if any."""
    example = example_config()
    if example is None:
        return "pass --config FILE, set SWITCHBOARD_CONFIG, or copy config.example.yaml there"
    return (f"`make run` uses {example}: pass --config {example}, set SWITCHBOARD_CONFIG, "
            "or copy it there")


def read_text(path: Path, source: str) -> str:
    shown = str(path)
    how = "pass --config FILE, set SWITCHBOARD_CONFIG, or copy config.example.yaml there"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fix = how if source == "given with --config" else missing_config_fix()
        raise ConfigError(f"no config file at {path.resolve()} ({source}); {fix}", file=shown) from None
    except IsADirectoryError:
        raise ConfigError(f"{path.resolve()} is a directory, not a config file ({source}); {how}", file=shown) from None
    except PermissionError:
        raise ConfigError(f"cannot read {path.resolve()}: permission denied; make it readable by this user", file=shown) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"is not UTF-8 text (byte {exc.start}); save it as UTF-8", file=shown) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path.resolve()}: {exc.strerror}", file=shown) from None


ENV_FILENAME = "switchboard.env"  # the secrets beside the config (systemd's EnvironmentFile=, `switchboard setup`)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (systemd's EnvironmentFile= syntax: no ``export``, ``#`` comments, a value
    optionally in double or single quotes); a missing or unreadable file is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            values[name] = value
    return values


def with_env_file(config_path: Path, env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with the variables of ``switchboard.env`` beside the config filled in where ``env`` lacks
    them (the shell's own win), so `switchboard run` from a shell reads what the service reads."""
    extra = read_env_file(config_path.parent / ENV_FILENAME)
    if not extra:
        return env
    return collections.ChainMap(dict(env), {k: v for k, v in extra.items() if k not in env})


# --------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key here is a list or mapping; keys must be plain names", key_node.start_mark
            ) from None
        if key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f'duplicate key "{key}" (first set on line {first}); keep one of them', key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, file: str) -> dict:
    """Parse the file into a mapping; a syntax error names the line and column."""
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        # Built from problem + position only: PyYAML's own str() quotes the
        # offending line, which may hold a token.
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if isinstance(exc, yaml.constructor.ConstructorError):
            raise ConfigError(f"at {where}{problem}", file=file) from None
        raise ConfigError(f"YAML syntax error at {where}{problem}; check the indentation and quoting there", file=file) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error: {exc}", file=file) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"must be a mapping of keys at the top level (got {describe(data)}); start from config.example.yaml",
            file=file,
        )
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"top-level key {key!r} must be a name", file=file)
    return data


# --------------------------------------------------------------------------- ${VAR}

# $${ is a literal "${"; ${NAME} and ${NAME:-default}; a "${" that is not closed is an error.
_VAR = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_VAR_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


def expand_env(data: Any, env: Mapping[str, str], file: str, loc: Loc = (),
               sources: dict[str, list[tuple[str, str]]] | None = None) -> Any:
    """Expand ``${VAR}``/``${VAR:-default}`` in every string value (keys are left alone).

    ``sources``, when given, is filled with the variables each key's value came from (the key as
    :func:`format_loc` writes it -> ``[(NAME, value), ...]``; a default that stood in is not one), so
    an error about that value names the variable as well as the key (:func:`translate`).

    ``${VAR}`` must be set (an empty value counts as set); ``${VAR:-default}``
    uses the default when VAR is unset or empty, as in the shell.  Expansion
    happens after parsing, so a value can never change the file's structure;
    ``"8642"`` then becomes a number where the key wants one.
    """
    if isinstance(data, dict):
        return {k: expand_env(v, env, file, loc + (k,), sources) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, env, file, loc + (i,), sources) for i, v in enumerate(data)]
    if not isinstance(data, str) or "$" not in data:
        return data

    def substitute(m: re.Match) -> str:
        token = m.group(0)
        if token == "$${":
            return "${"
        body = m.group(1)
        parsed = _VAR_BODY.fullmatch(body) if body is not None else None
        if parsed is None:
            raise ConfigError(
                f'malformed "{token}": write ${{NAME}} or ${{NAME:-default}} (or $${{ for a literal "${{")',
                file=file,
                key=format_loc(loc),
            )
        name, default = parsed.group(1), parsed.group(2)
        value = env.get(name)
        if value and sources is not None:
            sources.setdefault(format_loc(loc), []).append((name, value))
        if default is not None:
            return value if value else default
        if value is None:
            raise ConfigError(
                f"environment variable {name} is not set; export {name}=..., "
                f"or write ${{{name}:-}} to default to empty",
                file=file,
                key=format_loc(loc),
            )
        return value

    return _VAR.sub(substitute, data)


# --------------------------------------------------------------------------- errors


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def describe(value: Any) -> str:
    """A short, quoted rendering of a bad value for an error message."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return json.dumps(text, ensure_ascii=False)
    return str(value)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and ``X | None`` so the walker sees the real type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return tp
            tp = rest[0]
        else:
            return tp


def _concrete(tp: Any) -> Any:
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel) and hasattr(tp, "concrete_model"):
        return tp.concrete_model()
    return tp


def _walk(root: type[BaseModel], loc: Loc) -> tuple[Any, Any]:
    """(type at loc, FieldInfo of the last model field on the way) or (None, None)."""
    tp: Any = root
    field = None
    for part in loc:
        tp = _concrete(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return None, None
            field = tp.model_fields[part]
            tp = field.annotation
        elif origin in (tuple, list) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif origin in (dict, collections.abc.Mapping):
            tp = typing.get_args(tp)[1]
        else:
            return None, None
    return _concrete(tp), field


def _is_secret(field: Any) -> bool:
    extra = getattr(field, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("secret"))


def _message(err: Mapping[str, Any], root: type[BaseModel]) -> tuple[Loc, str]:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    tp, field = _walk(root, loc)
    got = " (got a value hidden because it is a secret)" if _is_secret(field) else f" (got {describe(value)})"

    if kind == "extra_forbidden":
        parent, _ = _walk(root, loc[:-1])
        bad = str(loc[-1])
        if isinstance(parent, type) and issubclass(parent, BaseModel):
            valid = list(parent.model_fields)
            close = difflib.get_close_matches(bad, valid, n=1, cutoff=0.6)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            note = getattr(parent, "UNKNOWN_KEY_HELP", "")
            return loc, f'unknown key "{bad}"{hint}; valid keys here: {", ".join(valid) or "none"}' + (f" ({note})" if note else "")
        return loc, f'unknown key "{bad}"'
    if kind == "value_error" and isinstance(ctx.get("error"), KeyedError):
        exc = ctx["error"]
        return loc + tuple(int(p) if p.isdigit() else p for p in exc.key.split(".")), str(exc)
    if kind in ("value_error", "assertion_error") and ctx.get("error") is not None:
        return loc, str(ctx["error"])
    if kind == "missing":
        return loc, "is required"
    if kind in ("literal_error", "enum"):
        if typing.get_origin(tp) is Literal:
            choices = ", ".join(str(a) for a in typing.get_args(tp))
        else:
            choices = str(ctx.get("expected", "")).replace("'", "")
        return loc, f"must be one of {choices}{got}"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return loc, f"must be {words} {bound}{got}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return loc, f"must be a whole number{got}"
    if kind in ("float_parsing", "float_type"):
        return loc, f"must be a number{got}"
    if kind in ("bool_parsing", "bool_type"):
        return loc, f"must be true or false{got}"
    if kind in ("string_type", "string_sub_type"):
        return loc, f"must be a single text value{got}"
    if kind == "string_pattern_mismatch":
        return loc, f"must match the pattern {ctx.get('pattern')}{got}"
    if kind in ("string_too_short",):
        return loc, f"must not be empty{got}" if ctx.get("min_length") == 1 else f"must be at least {ctx.get('min_length')} characters"
    if kind in ("list_type", "tuple_type", "set_type"):
        return loc, f"must be a list{got}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        return loc, f"must be a mapping of keys{got}"
    if kind in ("path_type",):
        return loc, f"must be a file path{got}"
    return loc, f"{err.get('msg', 'is invalid')}{got}"


def from_variables(key: str, sources: Mapping[str, list[tuple[str, str]]] | None, *, secret: bool = False) -> str:
    """``"; set by NAME=value in the environment"`` when ``key``'s value (or its parent's) came from a
    variable, else ``""``; a secret's value is never shown, only the variable's name."""
    if not sources:
        return ""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:n]))
        if found:
            named = ", ".join(name if secret else f"{name}={value}" for name, value in found)
            return f"; set by {named} in the environment"
    return ""


def translate(exc: ValidationError, root: type[BaseModel], file: str | None,
              sources: Mapping[str, list[tuple[str, str]]] | None = None) -> ConfigError:
    """One ConfigError for the first problem, naming how many more there are, and the variable that
    set the value when one did (``sources`` from :func:`expand_env`)."""
    errors = exc.errors()
    loc, message = _message(errors[0], root)
    message += from_variables(format_loc(loc), sources, secret=_is_secret(_walk(root, loc)[1]))
    more = [format_loc(_message(e, root)[0]) or "(top level)" for e in errors[1:]]
    if more:
        message += f" (also wrong: {', '.join(dict.fromkeys(more))})"
    return ConfigError(message, file=file, key=format_loc(loc) or None)
