"""One serving lifetime for `mlx serve` and `mlx launch claude`: engine, server and state file.

`serving()` builds the three in one order and takes them down in the reverse one, whether the
block ends normally or by Ctrl-C, SIGTERM or SIGHUP: the state file goes, the server drains
(requests in flight get `DRAIN_S` to finish, then an `overloaded_error`), the engine closes.

The model's output is its own, but for `--model demo` (scripted replies, testing/demo.py) and
where a caller passes a `logits_hook`: that is how tests script a served model. The `mlx`
command never passes one; no environment variable reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import Console

from mlxlaunch.engine.config import ClusterRole, EngineConfig, LogitsHook
from mlxlaunch.engine.engine import Engine
from mlxlaunch.launch.child import terminating_like_ctrl_c
from mlxlaunch.launch.claude_env import client_settings
from mlxlaunch.launch.models import ChosenModel, demo_replies, resolve_name
from mlxlaunch.launch.options import EngineOptions
from mlxlaunch.launch.state import ClientSettings, RunKind, RunState, remove_state, write_state
from mlxlaunch.launch.warm import warm_up_in_background
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import DEFAULT_DRAIN_S, ServerHandle, start_server
from mlxlaunch.store.catalog import vision_pick

# How long requests still in flight when serving ends (Ctrl-C, claude exiting) may finish
# before they are answered "server is shutting down"; the same for both commands.
DRAIN_S = DEFAULT_DRAIN_S

# When the weights load: before serving starts, in the background while the user types (the
# first request shares that load), or when the first request needs them.
ModelLoad = Literal["now", "background", "on first request"]


@dataclass(frozen=True)
class Serving:
    """A model being served: what the announcement, the state file and clients need."""

    model: ChosenModel
    engine: Engine
    server: ServerHandle
    context_window: int  # tokens, as served (the loaded model's, or read from its config)
    client: ClientSettings  # what clients are told: derived from that window, once

    @property
    def url(self) -> str:
        """The base URL clients use, e.g. `http://127.0.0.1:8080`."""
        return self.server.url

    # The face a cluster's serve shares (launch/served.py).
    @property
    def failure(self) -> str | None:
        """A lost rank, in words: one process loses none."""
        return None

    def running(self) -> bool:
        """The server still serves."""
        return self.server.running

    def stopping_note(self) -> str:
        """What Ctrl-C prints: how long the requests in flight may still take."""
        return stopping_note(self.server.in_flight)


@contextlib.contextmanager
def serving(
    model: ChosenModel,
    engine_options: EngineOptions,
    settings: ServerSettings,
    *,
    kind: RunKind,
    console: Console,
    load: ModelLoad = "now",
    log_file: Path | None = None,
    log_level: str = "warning",
    logits_hook: LogitsHook | None = None,
    small_model: str | None = None,
    max_output_tokens: int | None = None,
    cluster: ClusterRole | None = None,
    state_pid: int | None = None,
) -> Iterator[Serving]:
    """Serve `model` for the duration of the block, then drain, stop and clean up.

    Args:
        model: the resolved model to serve.
        engine_options: the engine's options.
        settings: the HTTP server's (interface, port, token, the model id it lists).
        kind: what the state file says is running (`mlx ps` shows it).
        console: where the loading spinner goes (when `load` is "now").
        load: when the weights load.
        log_file: the server log the state file points to (None: the terminal).
        log_level: uvicorn's own log level.
        logits_hook: scripted output in place of the model's own (tests); None: the model's,
            or the demo's replies for `--model demo`.
        small_model: the id for Claude Code's background tier (None: the served model's).
        max_output_tokens: the output budget clients are told (None: from the window).
        cluster: this process is rank 0 of a cluster (launch/cluster_rank.py); None: the
            whole model in this process.
        state_pid: the process the state file names (default: this one; a cluster's rank 0
            names the `mlx` that started it, so `mlx stop` stops the whole cluster).

    Raises:
        ConfigError: a bad engine setting, or the port is taken.
    """
    hook = logits_hook if logits_hook is not None else demo_replies(model.name)
    if engine_options.debug_cache:  # one flag: the engine keeps the text, the server shares it
        settings = dataclasses.replace(settings, stats_prompt_excerpts=True)
    if not engine_options.safeguards:  # --no-safeguards: the server says the check is off
        settings = dataclasses.replace(settings, safeguards=False)
    if settings.vision_model is None:  # what a text-only model's refusal of an image names
        settings = dataclasses.replace(settings, vision_model=vision_pick().alias)
    draft = engine_options.draft_model
    config = EngineConfig(
        model=str(model.path),
        logits_hook=hook,
        cluster=cluster,
        draft_model=str(resolve_name(draft)) if draft else None,
        **engine_options.config_arguments(),
    )
    with terminating_like_ctrl_c(), contextlib.ExitStack() as stack:
        engine = Engine(config)
        engine.start()
        stack.callback(engine.close)
        if settings.threads_dir is None:
            settings = replace(settings, threads_dir=conversations_dir(config))
        server = start_server(engine, settings, log_level=log_level)
        stack.callback(server.stop, DRAIN_S)
        window = _load(engine, model, load, console, engine_options.context_length)
        client = client_settings(
            settings.model_id or model.served_id,
            window,
            small_model_id=small_model,
            max_output=max_output_tokens,
        )
        served = Serving(model, engine, server, window, client)
        write_state(
            RunState(
                pid=state_pid or os.getpid(),
                url=server.url,
                token=settings.auth_token or "",
                model=model.name,
                model_path=str(model.path),
                log_file=str(log_file or ""),
                kind=kind,
                client=client,
            )
        )
        stack.callback(remove_state, state_pid or os.getpid())
        yield served


def stopping_note(in_flight: int) -> str:
    """What Ctrl-C prints: how long the requests in flight may still take."""
    if not in_flight:
        return "stopping…"
    requests = "1 request" if in_flight == 1 else f"{in_flight} requests"
    return (
        f"stopping: {requests} in flight may finish for up to {DRAIN_S:g} s, then get "
        '"server is shutting down" (Ctrl-C again to stop now)'
    )


def conversations_dir(config: EngineConfig) -> Path | None:
    """Where stored conversations (message threads; stored responses beside them) are kept:
    where their KV is, across restarts, only when there is a disk tier. `--cache-disk 0`
    means nothing on disk: they then stay in memory (None)."""
    if config.cache_dir is None or config.cache_disk_bytes <= 0:
        return None
    return config.cache_dir / "threads"


def _load(
    engine: Engine,
    model: ChosenModel,
    load: ModelLoad,
    console: Console,
    context_length: int | None,
) -> int:
    """Start loading as `load` says; the context window that will be served."""
    if load == "now":
        with console.status(f"Loading {model.name}…"):
            return asyncio.run(engine.load()).context_window
    if load == "background":
        warm_up_in_background(engine)  # the model and its cached prefixes, while the user types
    config = engine.config
    return model.context_window(
        context_length, config.kv_bits, config.kv_group_size, config.memory_fraction
    )
