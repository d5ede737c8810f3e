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
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import Console

from mlxlaunch.engine.config import ClusterRole, EngineConfig, LogitsHook
from mlxlaunch.engine.models import MISSING, ModelRole, ModelSet, ServedModel, companion_config
from mlxlaunch.errors import MlxLaunchError
from mlxlaunch.home import mlxlaunch_home
from mlxlaunch.launch.child import terminating_like_ctrl_c
from mlxlaunch.launch.claude_env import claude_model_id, client_settings
from mlxlaunch.launch.models import (
    ChosenModel,
    demo_replies,
    is_test_model_name,
    pullable,
    resolve_name,
)
from mlxlaunch.launch.options import EngineOptions
from mlxlaunch.launch.state import ClientSettings, RunKind, RunState, remove_state, write_state
from mlxlaunch.launch.warm import warm_up_in_background
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import DEFAULT_DRAIN_S, ServerHandle, start_server
from mlxlaunch.server.sealed_reasoning import ReasoningSeal
from mlxlaunch.store.catalog import vision_pick
from mlxlaunch.store.facts import weights_size
from mlxlaunch.store.memory import system_memory_bytes, usable_memory
from mlxlaunch.store.resolve import resolve_model

log = logging.getLogger(__name__)

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
    engine: ModelSet  # the model, and any served beside it (--small-model, more --model)
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
    also: Sequence[str] = (),
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
        small_model: Claude Code's background (haiku) tier: a model loaded beside the main
            one, which serves that tier's requests (None: the main model serves them). A
            name that cannot be loaded is said in the log and stats, and the main model serves
            its requests; on a cluster it is only the id Claude Code is told.
        also: more models served beside the main one, each under its own names.
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
    if engine_options.speculate == "draft" and not engine_options.draft_model and small_model:
        # The small model drafts for the main one too: one set of weights, used twice.
        engine_options = replace(engine_options, draft_model=small_model)
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
    main = ServedModel(config, names=_names(settings.model_id or model.served_id, model.path))
    companions = [] if cluster is not None else _companions(small_model, also, model, config)
    with terminating_like_ctrl_c(), contextlib.ExitStack() as stack:
        engine = ModelSet(
            [main, *companions],
            # Not on a cluster: each rank would have to load the same model at once.
            finder=find_in_store if cluster is None else None,
            memory_budget=usable_memory(system_memory_bytes()) or None,
        )
        engine.start()
        stack.callback(engine.close)
        if settings.threads_dir is None:
            settings = replace(settings, threads_dir=conversations_dir(config))
        # One key for this machine's servers: a session's sealed reasoning outlives a restart.
        settings = replace(settings, reasoning_seal=ReasoningSeal.kept_in(reasoning_key_file()))
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


def reasoning_key_file() -> Path:
    """Where this machine's servers keep the key that seals Codex's reasoning."""
    return mlxlaunch_home() / "keys" / "reasoning.key"


def find_in_store(model_id: str) -> Path | Literal["missing"] | None:
    """What a request's model id names for models served on demand (engine/models.py): the
    directory of a downloaded model; MISSING for one `mlx models pull` could fetch; None for
    any other id (Claude Code's tier ids, the test models' names), which the main model serves."""
    if is_test_model_name(model_id):
        return None
    try:
        found = resolve_model(model_id, record_use=True)
    except MlxLaunchError:
        return MISSING if pullable(model_id) else None
    # A client names models, never the server's directories.
    return None if found.source == "path" else found.path


def _names(name: str, path: Path) -> tuple[str, ...]:
    """The ids that pick a model: what it was called, as a plain id and as Claude Code is told
    it (launch/claude_env.py), and its directory's name."""
    return tuple(dict.fromkeys((plain_model_id(name), claude_model_id(name), path.name)))


def _companions(
    small_model: str | None, also: Sequence[str], main: ChosenModel, config: EngineConfig
) -> list[ServedModel]:
    """The models served beside `main`: the small one, then the others, each with the main
    model's engine settings but its own window and no draft model. A name that is the main
    model is no second model (its requests go there anyway); one that cannot be resolved is
    kept with its failure (the log, stats and `mlx ps` say why; the main model serves it)."""
    wanted: list[tuple[str, ModelRole]] = [(name, "extra") for name in also]
    if small_model:
        wanted.insert(0, (small_model, "small"))
    served: list[ServedModel] = []
    seen = {main.path.resolve()}
    for name, role in wanted:
        try:
            path = resolve_name(name)
        except MlxLaunchError as exc:
            why = f"{name}: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
            log.warning("the %s model is not served: %s", role, why)
            served.append(
                ServedModel(
                    companion_config(config, name), _names(name, Path(name)), role, failure=why
                )
            )
            continue
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        hook = demo_replies(name) or config.logits_hook
        served.append(
            ServedModel(
                replace(companion_config(config, str(path)), logits_hook=hook),
                _names(name, path),
                role,
            )
        )
    return served


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
    engine: ModelSet,
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
    beside = sum(weights_size(Path(m.config.model)) for m in engine.models[1:] if not m.failure)
    return model.context_window(
        context_length, config.kv_bits, config.kv_group_size, config.memory_fraction, beside
    )
