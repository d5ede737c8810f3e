"""`mlx serve`: the Anthropic-compatible server alone, for any client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import time
from typing import Annotated

import typer
from rich.console import Console

from mlxlaunch.cli.cache_options import (
    DEFAULT_CACHE_DISK,
    CacheDirOption,
    CacheDiskOption,
    CacheMemoryOption,
    cache_config,
)
from mlxlaunch.cli.options import model_option
from mlxlaunch.cli.scheduler_options import (
    DEFAULT_IDLE_CLEAR,
    DEFAULT_MEMORY_FRACTION,
    ContextLengthOption,
    IdleClearOption,
    KeepAliveOption,
    MaxConcurrencyOption,
    MemoryFractionOption,
    engine_tuning,
)
from mlxlaunch.launch.child import terminating_like_ctrl_c
from mlxlaunch.launch.claude_env import ClaudeTarget, export_lines, launch_variables
from mlxlaunch.launch.models import demo_replies, resolve_name
from mlxlaunch.launch.state import RunState, remove_state, write_state
from mlxlaunch.testing import is_test_model_name, notice_for_test_model

# How long requests in flight at Ctrl-C may finish before the server is forced down.
DRAIN_S = 5.0
REQUEST_LOG_FORMAT = "%(asctime)s %(message)s"

SERVE_HELP = """Serve a model under the Anthropic Messages API (POST /v1/messages).

Prints the URL and the environment a client needs, logs one line per request, and stops \
cleanly on Ctrl-C. Without --auth-token a fresh random token is made and printed.

Examples:

  mlx serve --model demo

  mlx serve --model qwen-coder-7b --port 8080 --auth-token secret

  mlx serve --model ./my-mlx-model --context-length 32768

  mlx serve --model demo --host 0.0.0.0 --allow-remote
"""

_console = Console(stderr=True)


def serve(
    model: Annotated[str, model_option("Alias, repo id, local path, or `demo`.")],
    host: Annotated[
        str, typer.Option(help="Interface to listen on (beyond loopback needs --allow-remote).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8080,
    auth_token: Annotated[
        str | None,
        typer.Option(
            envvar="MLX_AUTH_TOKEN",
            help="Token clients must send (Bearer or x-api-key). Default: a random one.",
            show_default=False,
        ),
    ] = None,
    context_length: ContextLengthOption = None,
    max_concurrency: MaxConcurrencyOption = None,
    idle_clear: IdleClearOption = DEFAULT_IDLE_CLEAR,
    keep_alive: KeepAliveOption = None,
    memory_fraction: MemoryFractionOption = DEFAULT_MEMORY_FRACTION,
    cache_memory: CacheMemoryOption = "auto",
    cache_dir: CacheDirOption = None,
    cache_disk: CacheDiskOption = DEFAULT_CACHE_DISK,
    preload: Annotated[
        bool, typer.Option("--preload/--no-preload", help="Load the model before serving.")
    ] = True,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help="Allow a --host other machines can reach (auth stays on)."
        ),
    ] = False,
    no_auth: Annotated[
        bool,
        typer.Option("--no-auth", help="Accept requests without a token (loopback only)."),
    ] = False,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            help="Browser origin allowed to call the server, e.g. http://localhost:3000 "
            "(repeatable; none by default).",
            show_default=False,
        ),
    ] = None,
) -> None:
    if is_test_model_name(model):
        _console.print(f"[bold yellow]note:[/] {notice_for_test_model(model)}", highlight=False)
    token, origins = _security_options(host, auth_token, no_auth, allow_remote, allow_origin)
    path = resolve_name(model)
    _log_requests_to_terminal()

    # The engine (and mlx) load only when serving, keeping every other `mlx` command quick.
    from mlxlaunch.engine.config import EngineConfig
    from mlxlaunch.engine.engine import Engine
    from mlxlaunch.launch.test_hook import scripted_output_from_env
    from mlxlaunch.protocol.limits import plain_model_id
    from mlxlaunch.server.app import ServerSettings
    from mlxlaunch.server.runner import start_server

    engine = Engine(
        EngineConfig(
            model=str(path),
            context_length=context_length,
            **engine_tuning(
                max_concurrency=max_concurrency,
                idle_clear=idle_clear,
                keep_alive=keep_alive,
                memory_fraction=memory_fraction,
            ),
            **cache_config(cache_memory, cache_dir, cache_disk),
            # As for `mlx launch`: a test's scripted output if one is set, else the demo's.
            logits_hook=scripted_output_from_env(os.environ) or demo_replies(model),
        )
    )
    with terminating_like_ctrl_c(), contextlib.ExitStack() as stack:
        engine.start()
        stack.callback(engine.close)
        settings = ServerSettings(
            host=host,
            port=port,
            auth_token=token,
            allow_remote=allow_remote,
            allowed_origins=origins,
            model_id=plain_model_id(model),  # a path is not a model id clients may send
        )
        handle = start_server(engine, settings)
        stack.callback(handle.stop, DRAIN_S)
        window: int | None = None
        if preload:
            with _console.status(f"Loading {model}…"):
                window = asyncio.run(engine.load()).context_window
        write_state(
            RunState(
                pid=os.getpid(),
                url=handle.url,
                token=token or "",
                model=model,
                model_path=str(path),
                log_file="",
                kind="serve",
            )
        )
        stack.callback(remove_state, os.getpid())
        target = ClaudeTarget(
            base_url=handle.url,
            auth_token=token or "no-auth",
            model_id=plain_model_id(model),  # a path is not a model id clients may send
            context_window=window,
        )
        typer.echo(f"mlx: serving {model} at {handle.url}")
        typer.echo("Point a client at it with:\n")
        typer.echo(export_lines(launch_variables(target)))
        typer.echo("\nWatch it live from another terminal: mlx dash")
        typer.echo("\nPress Ctrl-C to stop.", nl=True)
        sys.stdout.flush()
        try:
            while handle.running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            _console.print(_stopping_note(handle.in_flight), highlight=False)
    _console.print("stopped")


def _stopping_note(in_flight: int) -> str:
    if not in_flight:
        return "stopping…"
    requests = "1 request" if in_flight == 1 else f"{in_flight} requests"
    return (
        f"stopping: {requests} in flight may finish for up to {DRAIN_S:g} s, then get "
        '"server is shutting down" (Ctrl-C again to stop now)'
    )


def _security_options(
    host: str,
    auth_token: str | None,
    no_auth: bool,
    allow_remote: bool,
    allow_origin: list[str] | None,
) -> tuple[str | None, tuple[str, ...]]:
    """The token to require (None: no auth) and the allowed origins; refuses unsafe setups
    before anything loads (the rules live in server/guards.py, SECURITY.md explains them)."""
    from mlxlaunch.errors import ConfigError
    from mlxlaunch.server.guards import check_exposure, check_origin_spec

    if no_auth and auth_token:
        raise ConfigError("--no-auth and --auth-token contradict each other")
    token = None if no_auth else (auth_token or secrets.token_urlsafe(32))
    check_exposure(host, auth_token=token, allow_remote=allow_remote)
    origins = tuple(check_origin_spec(origin) for origin in allow_origin or ())
    if no_auth:
        _console.print(
            "[bold yellow]warning:[/] --no-auth: any program on this machine can use the "
            "server (web pages still cannot: the host and origin checks stay on)",
            highlight=False,
        )
    return token, origins


def _log_requests_to_terminal() -> None:
    """One line per request from the server's logger, unless logging is already set up."""
    server_log = logging.getLogger("mlxlaunch.server")
    if server_log.level == logging.NOTSET:
        server_log.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not server_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(REQUEST_LOG_FORMAT, datefmt="%H:%M:%S"))
        server_log.addHandler(handler)
