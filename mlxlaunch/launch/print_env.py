"""`mlx launch claude --print-env`: the variables for using a running server from another shell."""

from __future__ import annotations

from pathlib import Path

from mlxlaunch.engine.settings import context_window_of
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.launch.claude_env import ClaudeTarget
from mlxlaunch.launch.state import RunState, running_servers
from mlxlaunch.store.facts import read_config


class NoRunningServer(MlxLaunchError):
    """--print-env found no server to point at."""


def _window_of(model_path: str, override: int | None) -> int | None:
    if override is not None:
        return override
    config_file = Path(model_path) / "config.json"
    return context_window_of(read_config(Path(model_path))) if config_file.is_file() else None


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
) -> ClaudeTarget:
    """Where Claude Code should go: a running server from the state files, or --url/--token.

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
    model_id = model or (state.model if state else "local-model")
    window = _window_of(state.model_path, context_length) if state else context_length
    return ClaudeTarget(
        base_url=url or (state.url if state else ""),
        auth_token=token or (state.token if state else ""),
        model_id=model_id,
        context_window=window,
        small_model_id=small_model,
        max_output_tokens=max_output_tokens,
        extra=extra or {},
    )
