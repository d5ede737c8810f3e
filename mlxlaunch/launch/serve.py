"""`mlx serve`: the Anthropic-compatible server alone, for any client, until Ctrl-C.

Unsafe setups (a reachable interface without --allow-remote, --no-auth with a token) are
refused before the model loads; the announcement on stdout says where the server is and which
environment points a client at it; Ctrl-C drains the requests in flight (launch/serving.py).
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import TextIO

from rich.console import Console

from mlxlaunch.config import load_config
from mlxlaunch.engine.config import LogitsHook
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_env import (
    ClaudeTarget,
    export_lines,
    launch_variables,
)
from mlxlaunch.launch.cluster_serve import ClusterFailed
from mlxlaunch.launch.models import (
    ChosenModel,
    is_test_model_name,
    notice_for_test_model,
    resolve_name,
)
from mlxlaunch.launch.options import ServeOptions
from mlxlaunch.launch.served import Served, served
from mlxlaunch.launch.server_log import log_requests_to_terminal
from mlxlaunch.launch.serving import ModelLoad
from mlxlaunch.protocol.limits import plain_model_id
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.guards import check_exposure, check_origin_spec
from mlxlaunch.server.search_backends import configured_backend


def serve_model(
    options: ServeOptions,
    *,
    console: Console,
    stdout: TextIO | None = None,
    logits_hook: LogitsHook | None = None,
    rank_command: tuple[str, ...] | None = None,
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
    if options.cluster is not None:  # this host may hold only its shard
        from mlxlaunch.launch.cluster_rank import rank_model_dir

        model = ChosenModel(options.model, rank_model_dir(options.model), "--model")
    else:
        model = ChosenModel(options.model, resolve_name(options.model), "--model")
        log_requests_to_terminal()
    settings = ServerSettings(
        host=options.host,
        port=options.port,
        auth_token=token,
        allow_remote=options.allow_remote,
        allowed_origins=origins,
        model_id=plain_model_id(options.model),  # a path is not a model id clients may send
        search=configured_backend(load_config()),
    )
    load: ModelLoad = "now" if options.preload else "on first request"
    with served(
        model,
        options.engine,
        settings,
        kind="serve",
        console=console,
        cluster=options.cluster,
        load=load,
        logits_hook=logits_hook,
        small_model=options.small_model,
        also=options.also,
        rank_command=rank_command,
    ) as now:
        _announce(stdout or sys.stdout, now, token)
        try:
            while now.running():
                time.sleep(0.2)
        except KeyboardInterrupt:
            console.print(now.stopping_note(), highlight=False)
    if now.failure is not None:
        raise ClusterFailed(f"{now.failure}; every rank has stopped")
    console.print("stopped")


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


def _announce(out: TextIO, now: Served, token: str | None) -> None:
    # The settings the state file holds: --print-env from another shell prints the same.
    target = ClaudeTarget.of(now.url, token or "no-auth", now.client)
    print(f"mlx: serving {now.model.name} at {now.url}", file=out)
    print("Point a client at it with:\n", file=out)
    print(export_lines(launch_variables(target)), file=out)
    print("\nWatch it live from another terminal: mlx dash", file=out)
    print("\nPress Ctrl-C to stop.", file=out, flush=True)
