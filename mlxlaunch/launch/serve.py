"""`mlx serve`: the Anthropic-compatible server alone, for any client, until Ctrl-C.

Unsafe setups (a reachable interface without --allow-remote, --no-auth with a token) are
refused before the model loads; the announcement on stdout says where the server is and which
environment points a client at it; Ctrl-C drains the requests in flight (launch/serving.py).
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console

from mlxlaunch.engine.config import LogitsHook
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_env import ClaudeTarget, export_lines, launch_variables
from mlxlaunch.launch.models import (
    ChosenModel,
    is_test_model_name,
    notice_for_test_model,
    resolve_name,
)
from mlxlaunch.launch.server_log import log_requests_to_terminal
from mlxlaunch.launch.serving import DRAIN_S, EngineOptions, ModelLoad, Serving, serving
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.guards import check_exposure, check_origin_spec


@dataclass(frozen=True)
class ServeOptions:
    """What `mlx serve` was asked to do (CLI options, already parsed)."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    auth_token: str | None = None  # None: a fresh random token, unless no_auth
    no_auth: bool = False
    allow_remote: bool = False
    allowed_origins: Sequence[str] = ()
    preload: bool = True
    engine: EngineOptions = field(default_factory=EngineOptions)


def serve_model(
    options: ServeOptions,
    *,
    console: Console,
    stdout: TextIO | None = None,
    logits_hook: LogitsHook | None = None,
) -> None:
    """Serve `options.model` until Ctrl-C, SIGTERM or SIGHUP; then drain and clean up.

    The announcement (URL, client environment) goes to `stdout`, notes and the request log to
    stderr. `logits_hook` scripts the model's output (tests; see launch/serving.py).

    Raises:
        ConfigError: an unsafe or contradictory security setup, or a port that is taken.
        ModelNotFound: the model is not local.
    """
    if is_test_model_name(options.model):
        console.print(
            f"[bold yellow]note:[/] {notice_for_test_model(options.model)}", highlight=False
        )
    token, origins = _security(options, console)
    model = ChosenModel(options.model, resolve_name(options.model), "--model")
    log_requests_to_terminal()
    settings = ServerSettings(
        host=options.host,
        port=options.port,
        auth_token=token,
        allow_remote=options.allow_remote,
        allowed_origins=origins,
        model_id=plain_model_id(options.model),  # a path is not a model id clients may send
    )
    load: ModelLoad = "now" if options.preload else "on first request"
    with serving(
        model,
        options.engine,
        settings,
        kind="serve",
        console=console,
        load=load,
        logits_hook=logits_hook,
    ) as served:
        _announce(stdout or sys.stdout, served, token)
        try:
            while served.server.running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            console.print(stopping_note(served.server.in_flight), highlight=False)
    console.print("stopped")


def stopping_note(in_flight: int) -> str:
    """What Ctrl-C prints: how long the requests in flight may still take."""
    if not in_flight:
        return "stopping…"
    requests = "1 request" if in_flight == 1 else f"{in_flight} requests"
    return (
        f"stopping: {requests} in flight may finish for up to {DRAIN_S:g} s, then get "
        '"server is shutting down" (Ctrl-C again to stop now)'
    )


def _security(options: ServeOptions, console: Console) -> tuple[str | None, tuple[str, ...]]:
    """The token clients must send (None: no auth) and the allowed origins; refuses unsafe
    setups before anything loads (the rules live in server/guards.py, SECURITY.md explains
    them)."""
    if options.no_auth and options.auth_token:
        raise ConfigError("--no-auth and --auth-token contradict each other")
    token = None if options.no_auth else (options.auth_token or secrets.token_urlsafe(32))
    check_exposure(options.host, auth_token=token, allow_remote=options.allow_remote)
    origins = tuple(check_origin_spec(origin) for origin in options.allowed_origins)
    if options.no_auth:
        console.print(
            "[bold yellow]warning:[/] --no-auth: any program on this machine can use the "
            "server (web pages still cannot: the host and origin checks stay on)",
            highlight=False,
        )
    return token, origins


def _announce(out: TextIO, served: Serving, token: str | None) -> None:
    # The settings the state file holds: --print-env from another shell prints the same.
    target = ClaudeTarget.of(served.url, token or "no-auth", served.client)
    print(f"mlx: serving {served.model.name} at {served.url}", file=out)
    print("Point a client at it with:\n", file=out)
    print(export_lines(launch_variables(target)), file=out)
    print("\nWatch it live from another terminal: mlx dash", file=out)
    print("\nPress Ctrl-C to stop.", file=out, flush=True)
