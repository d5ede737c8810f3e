"""`mlx serve`: the Anthropic-compatible server alone, for any client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from mlxlaunch.cli.app import app
from mlxlaunch.launch.claude_env import ClaudeTarget, export_lines, launch_variables
from mlxlaunch.launch.models import resolve_name
from mlxlaunch.launch.state import RunState, remove_state, write_state
from mlxlaunch.testing import DEMO_NOTICE, is_test_model_name

# How long requests in flight at Ctrl-C may finish before the server is forced down.
DRAIN_S = 5.0
REQUEST_LOG_FORMAT = "%(asctime)s %(message)s"

SERVE_HELP = """Serve a model under the Anthropic Messages API (POST /v1/messages).

Prints the URL and the environment a client needs, logs one line per request, and stops \
cleanly on Ctrl-C. Without --auth-token a fresh random token is made and printed.

Examples:

  mlx serve --model demo

  mlx serve --model qwen-coder-7b --port 8080 --auth-token secret

  mlx serve --model ./my-mlx-model --context-length 32768 --host 0.0.0.0
"""

_console = Console(stderr=True)


@app.command("serve", help=SERVE_HELP)
def serve(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Alias, repo id, local path, or `demo`.")
    ],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8080,
    auth_token: Annotated[
        str | None,
        typer.Option(
            envvar="MLX_AUTH_TOKEN",
            help="Token clients must send (Bearer or x-api-key). Default: a random one.",
            show_default=False,
        ),
    ] = None,
    context_length: Annotated[
        int | None, typer.Option(min=2, help="Context window to serve (default: the model's).")
    ] = None,
    max_concurrency: Annotated[
        int | None, typer.Option(min=1, help="Requests decoded together (default: 4 CPU, 8 GPU).")
    ] = None,
    preload: Annotated[
        bool, typer.Option("--preload/--no-preload", help="Load the model before serving.")
    ] = True,
) -> None:
    if is_test_model_name(model):
        _console.print(f"[bold yellow]note:[/] {DEMO_NOTICE}", highlight=False)
    path = resolve_name(model)
    token = auth_token or secrets.token_urlsafe(32)
    _log_requests_to_terminal()

    # The engine (and mlx) load only when serving, keeping every other `mlx` command quick.
    from mlxlaunch.engine.config import EngineConfig, default_max_concurrency
    from mlxlaunch.engine.engine import Engine
    from mlxlaunch.server.app import ServerSettings
    from mlxlaunch.server.runner import start_server

    engine = Engine(
        EngineConfig(
            model=str(path),
            context_length=context_length,
            max_concurrency=max_concurrency or default_max_concurrency(),
        )
    )
    with _stop_on_signals(), contextlib.ExitStack() as stack:
        engine.start()
        stack.callback(engine.close)
        handle = start_server(engine, ServerSettings(host=host, port=port, auth_token=token))
        stack.callback(handle.stop, DRAIN_S)
        window: int | None = None
        if preload:
            with _console.status(f"Loading {model}…"):
                window = asyncio.run(engine.load()).context_window
        write_state(
            RunState(
                pid=os.getpid(),
                url=handle.url,
                token=token,
                model=model,
                model_path=str(path),
                log_file="",
                kind="serve",
            )
        )
        stack.callback(remove_state, os.getpid())
        target = ClaudeTarget(
            base_url=handle.url, auth_token=token, model_id=model, context_window=window
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
            _console.print("stopping…")
    _console.print("stopped")


def _log_requests_to_terminal() -> None:
    """One line per request from the server's logger, unless logging is already set up."""
    server_log = logging.getLogger("mlxlaunch.server")
    if server_log.level == logging.NOTSET:
        server_log.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not server_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(REQUEST_LOG_FORMAT, datefmt="%H:%M:%S"))
        server_log.addHandler(handler)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM (and SIGHUP) unwind like Ctrl-C, so the server drains and the port is freed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
