"""The user's own settings (`mlx config set default-model …`), kept in one TOML file.

The file lives in the platform's user config directory (or `$MLXLAUNCH_CONFIG_DIR`), holds
`key = value` pairs (a dotted name such as `search.backend` is key `backend` of table
`[search]`, as TOML reads it), and is only ever written by `_write_raw` so hand edits stay
readable.
Unknown keys in the file are kept and ignored, so an older mlxlaunch never destroys a newer
one's settings. Every value is checked by the same rule when it is set and when the file is read
(a hand edit included), so a bad one is a ConfigError naming the key, never a failed launch.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from mlxlaunch.engine.settings import parse_duration
from mlxlaunch.errors import ConfigError
from mlxlaunch.home import private_dir

CONFIG_DIR_ENV = "MLXLAUNCH_CONFIG_DIR"
CONFIG_FILENAME = "config.toml"
# The search API's key, where a user keeps it out of the config file.
SEARCH_API_KEY_ENV = "MLXLAUNCH_SEARCH_API_KEY"

# Claude Code's system prompt and tool definitions alone are ~15k tokens (14.5k measured with
# 2.1.332); a smaller window fails every request, so it is refused up front.
MIN_CONTEXT_LENGTH = 16384


def check_context_length(tokens: int) -> int:
    """`tokens` if it is a usable context window; ValueError with the reason otherwise.

    The one rule for `--context-length` (serve and launch) and the `context-length` setting.
    """
    if tokens < MIN_CONTEXT_LENGTH:
        raise ValueError(
            f"{tokens} is below the minimum of {MIN_CONTEXT_LENGTH}: Claude Code's system "
            "prompt and tools alone take ~15k tokens"
        )
    return tokens


def _whole_number(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected a whole number") from None


def _context_length(text: str) -> int:
    return check_context_length(_whole_number(text))


def _port(text: str) -> int:
    value = _whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError("a port is 0 to 65535 (0: any free one)")
    return value


def _duration(text: str) -> str:
    """A duration as the engine's sweeper reads it (`30m`, `2h`, `0`, `never`); kept as text."""
    parse_duration(text)  # ValueError with the accepted forms
    return text.strip()


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a non-empty value")
    return text.strip()


SEARCH_BACKENDS = ("searxng", "brave")


def _search_backend(text: str) -> str:
    name = text.strip().lower()
    if name not in SEARCH_BACKENDS:
        raise ValueError(f"expected one of: {', '.join(SEARCH_BACKENDS)}")
    return name


def _http_url(text: str) -> str:
    url = text.strip().rstrip("/")
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise ValueError("expected an http:// or https:// URL, such as http://127.0.0.1:8888")
    return url


@dataclass(frozen=True)
class ConfigKey:
    """One setting: its name on the command line and in the file, and how to read it.

    `names_model`: the value is a model to serve, which `mlx config set` also checks against
    the models mlx knows (cli/config.py: that needs the store, this module must not).
    """

    name: str
    help: str
    parse: Callable[[str], Any]
    names_model: bool = False
    secret: bool = False  # shown masked by `mlx config show`


KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in (
        ConfigKey("default-model", "model `mlx launch` uses without --model", _text, True),
        ConfigKey(
            "default-small-model",
            "small model `mlx launch claude` serves for Claude Code's haiku tier",
            _text,
            True,
        ),
        # The older name of the same setting, still read (launch/session.py).
        ConfigKey("small-model", "older name of default-small-model", _text),
        ConfigKey("port", "port for the server, 0-65535 (default: a free one)", _port),
        ConfigKey(
            "context-length",
            f"context window in tokens, at least {MIN_CONTEXT_LENGTH} (default: the model's)",
            _context_length,
        ),
        ConfigKey(
            "keep-alive", "how long an idle model stays loaded, e.g. 30m, 2h or never", _duration
        ),
        ConfigKey(
            "search.backend",
            f"web search for the agents' search tool: {' or '.join(SEARCH_BACKENDS)} "
            "(default: none)",
            _search_backend,
        ),
        ConfigKey(
            "search.url",
            "the search backend's base URL (searxng: required; brave: its API by default)",
            _http_url,
        ),
        ConfigKey(
            "search.api-key",
            f"the search API's key (brave), or set ${SEARCH_API_KEY_ENV}",
            _text,
            secret=True,
        ),
    )
}


@dataclass(frozen=True)
class UserConfig:
    """The settings read from the config file; `None` where the user set nothing."""

    values: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the file they came from, for messages about them

    def get(self, key: str) -> Any:
        """The value of a known key, or None when unset."""
        _check_key(key)
        return self.values.get(key)

    @property
    def default_model(self) -> str | None:
        value = self.values.get("default-model")
        return value if isinstance(value, str) else None


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """Directory of the config file: `$MLXLAUNCH_CONFIG_DIR`, else the platform's."""
    env = os.environ if env is None else env
    override = env.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir("mlxlaunch"))


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """Path of the config file (it need not exist)."""
    return config_dir(env) / CONFIG_FILENAME


def _check_key(key: str) -> ConfigKey:
    try:
        return KEYS[key]
    except KeyError:
        known = ", ".join(KEYS)
        raise ConfigError(f"unknown setting {key!r}", hint=f"known settings: {known}") from None


def _read_raw(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return _flat(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint=f"fix or delete {path}") from exc


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML tables flattened to dotted names: `[search] backend = …` is `search.backend`."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def load_config(env: Mapping[str, str] | None = None) -> UserConfig:
    """Read the user's settings; a missing file means no settings."""
    path = config_path(env)
    raw = _read_raw(path)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in KEYS:
            continue  # kept on disk, ignored here
        try:
            values[key] = KEYS[key].parse(str(value))
        except ValueError as exc:
            raise ConfigError(
                f"{path}: {key} = {value!r} is refused: {exc}",
                hint=f"mlx config set {key} VALUE ({KEYS[key].help}), or mlx config unset {key}",
            ) from exc
    return UserConfig(values, path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    # JSON string escapes are a subset of TOML basic-string escapes.
    return json.dumps(str(value), ensure_ascii=False)


def _toml_key(key: str) -> str:
    """A bare key where TOML allows one (`port`), else a quoted one (`"a.b"` stays one key)."""
    return (
        key
        if key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
        else (json.dumps(key, ensure_ascii=False))
    )


def _write_raw(path: Path, raw: Mapping[str, Any]) -> None:
    """Write flat dotted names back as TOML: plain keys first, then one `[table]` per prefix,
    so the file reads back (`_flat`) to exactly the names written."""
    private_dir(path.parent)  # 0700 whatever the umask: nobody else may change settings
    lines = ["# mlxlaunch settings; change them with `mlx config set KEY VALUE`."]
    tables: dict[str, list[str]] = {}
    for name, value in raw.items():
        table, _, key = name.rpartition(".")
        line = f"{_toml_key(key)} = {_toml_value(value)}"
        if table:
            tables.setdefault(table, []).append(line)
        else:
            lines.append(line)
    for table, entries in tables.items():
        header = ".".join(_toml_key(part) for part in table.split("."))
        lines += ["", f"[{header}]", *entries]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # atomic, so a crash never leaves half a file


def set_value(key: str, text: str, env: Mapping[str, str] | None = None) -> Any:
    """Validate and store one setting; returns the parsed value."""
    spec = _check_key(key)
    try:
        value = spec.parse(text)
    except ValueError as exc:
        raise ConfigError(
            f"cannot set {key} to {text!r}: {exc}", hint=f"{key}: {spec.help}"
        ) from exc
    path = config_path(env)
    raw = _read_raw(path)
    raw[key] = value
    _write_raw(path, raw)
    return value


def unset_value(key: str, env: Mapping[str, str] | None = None) -> bool:
    """Remove one setting; returns whether it was set."""
    _check_key(key)
    path = config_path(env)
    raw = _read_raw(path)
    if key not in raw:
        return False
    del raw[key]
    _write_raw(path, raw)
    return True
