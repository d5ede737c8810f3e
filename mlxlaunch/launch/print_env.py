"""`mlx launch claude --print-env`: the variables for using a running server from another shell.

The window, output budget and model ids are the server's own, never guessed from config.json
while the server can say them (a server started with `--context-length 32768` serves 32768):

1. its state record, written by the serving process from the window its engine serves
   (`RunState.client`, derived by `claude_env.client_settings`, the same call that set up
   `mlx launch claude`'s child and `mlx serve`'s announcement);
2. else the server itself, for a `--url` with no record here (another home, another machine):
   `GET /v1/models`, whose entry names the window and output cap as Anthropic's Models API
   does (`max_input_tokens`, `max_tokens`);
3. else, for a record from an older writer, the model's config.json.

What the user passes (--model, --small-model, --context-length, --max-output-tokens) wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from mlxlaunch.engine.settings import context_window_of
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch import claude_env
from mlxlaunch.launch.claude_env import ClaudeTarget
from mlxlaunch.launch.state import ClientSettings, RunState, running_servers
from mlxlaunch.store.facts import read_config

# A local server answers /v1/models at once; a remote one gets a little longer.
ASK_TIMEOUT_S = 5.0


class NoRunningServer(MlxLaunchError):
    """--print-env found no server to point at."""


@dataclass(frozen=True)
class ServerReport:
    """What a server's `GET /v1/models` says about the model it serves (None: not said)."""

    model_id: str | None
    context_window: int | None
    max_output_tokens: int | None


def ask_server(
    url: str,
    token: str,
    *,
    timeout: float = ASK_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> ServerReport | None:
    """The served model's id and limits from the server; None when it does not answer."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(transport=transport, timeout=timeout) as client:
            response = client.get(url.rstrip("/") + "/v1/models", headers=headers)
        if response.status_code != 200:
            return None
        entries = response.json().get("data")
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    entry = entries[0]
    model_id = entry.get("id")
    return ServerReport(
        model_id=model_id if isinstance(model_id, str) and model_id else None,
        context_window=_tokens(entry.get("max_input_tokens")),
        max_output_tokens=_tokens(entry.get("max_tokens")),
    )


def _tokens(value: object) -> int | None:
    # bool is an int to Python, not a token count to anyone.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _config_window(model_path: str) -> int | None:
    """The window an older writer's server serves unless it was started with --context-length."""
    if not model_path or not (Path(model_path) / "config.json").is_file():
        return None
    return context_window_of(read_config(Path(model_path)))


def find_server(url: str | None, servers: list[RunState]) -> RunState | None:
    """The state of the server at `url` (any live one, newest first, when `url` is None)."""
    if url is None:
        return servers[0] if servers else None
    wanted = url.rstrip("/")
    return next((s for s in servers if s.url.rstrip("/") == wanted), None)


def print_env_target(
    *,
    url: str | None = None,
    token: str | None = None,
    model: str | None = None,
    small_model: str | None = None,
    context_length: int | None = None,
    max_output_tokens: int | None = None,
    extra: dict[str, str] | None = None,
    home: Path | None = None,
    transport: httpx.BaseTransport | None = None,
) -> ClaudeTarget:
    """Where Claude Code should go, with the settings the server states (see the module doc).

    `transport` carries the question to the server (tests); None: the network.

    Raises:
        NoRunningServer: nothing running matches and --url/--token do not say enough.
    """
    state = find_server(url, running_servers(home))
    if state is None and (url is None or token is None):
        where = f"at {url}" if url else "running"
        raise NoRunningServer(
            f"no mlx server found {where}",
            hint="start one with `mlx serve --model M`, or pass both --url and --token",
        )
    base_url = url or (state.url if state else "")
    auth_token = token or (state.token if state else "")
    recorded = state.client if state else None
    report = None if recorded else ask_server(base_url, auth_token, transport=transport)
    window = context_length or _stated_window(recorded, report, state)
    return ClaudeTarget(
        base_url=base_url,
        auth_token=auth_token,
        model_id=model or _stated_model_id(recorded, report, state),
        context_window=window,
        small_model_id=small_model or _stated_small_model(recorded),
        max_output_tokens=max_output_tokens
        or _stated_output(recorded, report, window, window_overridden=context_length is not None),
        extra=extra or {},
    )


def _stated_window(
    recorded: ClientSettings | None, report: ServerReport | None, state: RunState | None
) -> int | None:
    if recorded is not None:
        return recorded.context_window
    if report is not None and report.context_window is not None:
        return report.context_window
    return _config_window(state.model_path) if state else None


def _stated_model_id(
    recorded: ClientSettings | None, report: ServerReport | None, state: RunState | None
) -> str:
    if recorded is not None:
        return recorded.model_id
    if report is not None and report.model_id is not None:
        return report.model_id
    return state.model if state and state.model else "local-model"


def _stated_small_model(recorded: ClientSettings | None) -> str | None:
    """The recorded background-tier id, when it was chosen apart from the main one."""
    if recorded is None or recorded.small_model_id == recorded.model_id:
        return None  # the main id, whichever that is now (--model may name another)
    return recorded.small_model_id


def _stated_output(
    recorded: ClientSettings | None,
    report: ServerReport | None,
    window: int | None,
    *,
    window_overridden: bool,
) -> int | None:
    """The output budget the server states; None: derive it from the window."""
    if recorded is not None and not window_overridden:
        return recorded.max_output_tokens
    cap = report.max_output_tokens if report is not None else None
    if cap is None:
        return None
    return min(cap, claude_env.max_output_tokens(window)) if window else cap
