"""`mlx launch claude`: engine + server in this process, `claude` as a child, then clean up.

Order matters for the user: everything that can fail fast (claude missing, model unknown)
fails before a model loads; the log path is printed before the terminal is handed over; and
whatever happens, the state file goes, the server drains and stops, and the engine closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from mlxlaunch.config import UserConfig, load_config
from mlxlaunch.engine.cache_settings import DEFAULT_CACHE_DISK, cache_config
from mlxlaunch.engine.config import EngineConfig, LogitsHook
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.tuning import engine_tuning
from mlxlaunch.errors import ModelNotFound
from mlxlaunch.launch.child import run_child, terminating_like_ctrl_c
from mlxlaunch.launch.claude_bin import claude_version, find_claude
from mlxlaunch.launch.claude_env import ClaudeTarget, claude_environment, claude_model_id
from mlxlaunch.launch.models import ChosenModel, choose_model, demo_replies
from mlxlaunch.launch.server_log import logging_to, new_log_path, terminal_to_child
from mlxlaunch.launch.state import RunState, remove_state, write_state
from mlxlaunch.launch.test_hook import scripted_output_from_env
from mlxlaunch.launch.warm import warm_up_in_background
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server
from mlxlaunch.testing import is_test_model_name, notice_for_test_model

# How long requests still in flight when claude exits may finish before the server is forced.
DRAIN_S = 2.0


@dataclass
class LaunchOptions:
    """What `mlx launch claude` was asked to do (CLI options, already validated)."""

    model: str | None = None  # None: the default-model setting, else the best local model
    small_model: str | None = None  # None here and below: the user's setting, else automatic
    port: int | None = None
    context_length: int | None = None
    keep_alive: str | None = None
    max_concurrency: int | None = None  # None here and below: the engine's default
    idle_clear: str | None = None
    memory_fraction: float | None = None
    cache_memory: str = "auto"  # prefix cache: memory budget, saved-prefix dir, disk budget
    cache_dir: Path | None = None
    cache_disk: str = DEFAULT_CACHE_DISK
    max_output_tokens: int | None = None
    preload: bool = False
    claude_bin: str | None = None
    claude_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    verbose: bool = False


@dataclass(frozen=True)
class Served:
    """What the user and the state file are told about the running server."""

    model: ChosenModel
    url: str
    token: str
    context_window: int
    log_file: Path


def launch_claude(
    options: LaunchOptions,
    *,
    console: Console,
    environ: Mapping[str, str] | None = None,
    offer_pull: Callable[[], bool] | None = None,
) -> int:
    """Run Claude Code against a local model; returns claude's exit code.

    `offer_pull` is asked when no model was named and none is downloaded; it returns True
    once it has pulled one.
    """
    environ = dict(os.environ if environ is None else environ)
    claude = find_claude(options.claude_bin)
    if options.verbose:
        console.print(f"claude: {claude} ({claude_version(claude) or 'version unknown'})")
    config = load_config(environ)
    options = with_settings(options, config)
    tuning = engine_tuning(
        max_concurrency=options.max_concurrency,
        idle_clear=options.idle_clear,
        keep_alive=options.keep_alive,
        memory_fraction=options.memory_fraction,
    )  # before the model loads: a bad keep-alive setting fails fast
    chosen = _choose(options, config, offer_pull)
    log_file = new_log_path()
    with terminating_like_ctrl_c(), contextlib.ExitStack() as stack:
        stack.enter_context(logging_to(log_file))
        engine = Engine(
            EngineConfig(
                model=str(chosen.path),
                context_length=options.context_length,
                **tuning,
                **cache_config(options.cache_memory, options.cache_dir, options.cache_disk),
                logits_hook=_logits_hook(environ, chosen),
            )
        )
        engine.start()
        stack.callback(engine.close)
        token = secrets.token_urlsafe(32)
        handle = start_server(
            engine,
            ServerSettings(
                host="127.0.0.1",
                port=options.port or 0,
                auth_token=token,
                model_id=claude_model_id(chosen.served_id),  # what claude is told to send
            ),
            log_level="info",
        )
        stack.callback(handle.stop, DRAIN_S)
        if options.preload:
            with console.status(f"Loading {chosen.name}…"):
                info = asyncio.run(engine.load())
            window = info.context_window
        else:
            warm_up_in_background(engine)  # model and cached prefixes, while the user types
            window = chosen.context_window(options.context_length)
        served = Served(chosen, handle.url, token, window, log_file)
        write_state(_run_state(served))
        stack.callback(remove_state, os.getpid())
        _announce(console, served, options)
        env = claude_environment(
            ClaudeTarget(
                base_url=served.url,
                auth_token=token,
                model_id=chosen.served_id,
                context_window=window,
                small_model_id=options.small_model,
                max_output_tokens=options.max_output_tokens or _noise_cap(chosen),
                extra=options.extra_env,
            ),
            environ,
        )
        with terminal_to_child(log_file) as stdio:
            code = run_child([str(claude), *options.claude_args], env, stdio=stdio)
    return code


def with_settings(options: LaunchOptions, config: UserConfig) -> LaunchOptions:
    """Fill options the user left out from their `mlx config` settings."""
    return replace(
        options,
        small_model=options.small_model or config.get("small-model"),
        port=options.port if options.port is not None else config.get("port"),
        context_length=options.context_length or config.get("context-length"),
        keep_alive=options.keep_alive or config.get("keep-alive"),
    )


# Random-weight test models rarely emit an end token: without a cap each reply is noise up to
# the window-derived budget (minutes of it on a laptop CPU), which makes the demo feel hung.
TEST_MODEL_OUTPUT_CAP = 512


def _noise_cap(chosen: ChosenModel) -> int | None:
    """A short output budget for the offline test models (`demo`, `tiny`, …), else None."""
    return TEST_MODEL_OUTPUT_CAP if is_test_model_name(chosen.name) else None


def _logits_hook(environ: Mapping[str, str], chosen: ChosenModel) -> LogitsHook | None:
    """A test's scripted output if one is set, else the demo's replies for `--model demo`."""
    scripted = scripted_output_from_env(environ)
    return scripted if scripted is not None else demo_replies(chosen.name)


def _choose(
    options: LaunchOptions, config: UserConfig, offer_pull: Callable[[], bool] | None
) -> ChosenModel:
    try:
        return choose_model(options.model, config)
    except ModelNotFound:
        named = options.model or config.default_model
        if named is not None or offer_pull is None or not offer_pull():
            raise
    return choose_model(None, config)


def _run_state(served: Served) -> RunState:
    return RunState(
        pid=os.getpid(),
        url=served.url,
        token=served.token,
        model=served.model.name,
        model_path=str(served.model.path),
        log_file=str(served.log_file),
        kind="launch",
    )


def _announce(console: Console, served: Served, options: LaunchOptions) -> None:
    model_id = claude_model_id(served.model.served_id)
    console.print(
        f"[bold]mlx[/]: serving [cyan]{served.model.name}[/] as [cyan]{model_id}[/] "
        f"({served.context_window:,}-token window) at {served.url}",
        highlight=False,
    )
    if is_test_model_name(served.model.name):
        console.print(
            f"[yellow]note:[/] {notice_for_test_model(served.model.name)}", highlight=False
        )
    if not options.preload:
        console.print("[dim]the model loads in the background while you type[/]")
    console.print(f"[dim]server log: {served.log_file}[/]", highlight=False)
    console.print("[dim]watch it live from another terminal: mlx dash[/]")
    if options.verbose:
        console.print(f"model: {served.model.path} (from {served.model.reason})", highlight=False)
