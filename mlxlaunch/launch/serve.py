"""`mlx serve`: the Anthropic-compatible server alone, for any client, until Ctrl-C.

Unsafe setups (a reachable interface without --allow-remote, --no-auth with a token) are
refused before the model loads; the announcement on stdout says where the server is and which
environment points a client at it; Ctrl-C drains the requests in flight (launch/serving.py).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console

from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.engine.config import LogitsHook
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.child import terminating_like_ctrl_c
from mlxlaunch.launch.claude_env import (
    ClaudeTarget,
    client_settings,
    export_lines,
    launch_variables,
)
from mlxlaunch.launch.models import (
    ChosenModel,
    is_test_model_name,
    notice_for_test_model,
    resolve_name,
)
from mlxlaunch.launch.server_log import log_requests_to_terminal
from mlxlaunch.launch.serving import DRAIN_S, EngineOptions, ModelLoad, Serving, serving
from mlxlaunch.launch.state import ClientSettings
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
    cluster: Cluster | None = None  # several machines (launch/cluster_serve.py); None: this one


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
    if options.cluster is not None:
        from mlxlaunch.launch.cluster_rank import rank_model_dir

        model = ChosenModel(options.model, rank_model_dir(options.model), "--model")
        _serve_on_cluster(
            options, options.cluster, model, token, origins, console, stdout, rank_command
        )
        return
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


def _serve_on_cluster(
    options: ServeOptions,
    cluster: Cluster,
    model: ChosenModel,
    token: str | None,
    origins: tuple[str, ...],
    console: Console,
    stdout: TextIO | None,
    rank_command: tuple[str, ...] | None,
) -> None:
    """`mlx serve --hosts`: rank 0 serves here, the other ranks follow, until Ctrl-C or
    until a rank is lost (then ClusterFailed says which)."""
    from mlxlaunch.launch.cluster_commands import checked_parallel, describe, engine_fields
    from mlxlaunch.launch.cluster_rank import RankSpec
    from mlxlaunch.launch.cluster_serve import RANK_MODULE, ClusterFailed, cluster_serving

    parallel = checked_parallel(cluster, options.model)
    model_id = plain_model_id(options.model)
    spec = RankSpec(
        model=options.model,
        parallel=parallel,
        kind="serve",
        engine=engine_fields(options.engine),
        host=options.host,
        port=options.port,
        auth_token=token,
        allow_remote=options.allow_remote,
        allowed_origins=origins,
        model_id=model_id,
        supervisor_pid=os.getpid(),
    )
    console.print(f"mlx: serving {model.name} on {describe(cluster, parallel)}", highlight=False)

    def relay(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    ranks = None
    with terminating_like_ctrl_c():
        try:
            with cluster_serving(
                model,
                cluster,
                spec,
                relay,
                lambda window: client_settings(model_id or model.served_id, window),
                rank_command=rank_command or RANK_MODULE,
            ) as served:
                ranks = served.ranks
                _announce_at(stdout or sys.stdout, model.name, served.url, served.client, token)
                while ranks.running():
                    time.sleep(0.2)
        except KeyboardInterrupt:
            console.print("stopping every rank…", highlight=False)
    if ranks is not None and ranks.failure is not None:
        raise ClusterFailed(f"{ranks.failure}; every rank has stopped")
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
    _announce_at(out, served.model.name, served.url, served.client, token)


def _announce_at(
    out: TextIO, name: str, url: str, client: ClientSettings, token: str | None
) -> None:
    # The settings the state file holds: --print-env from another shell prints the same.
    target = ClaudeTarget.of(url, token or "no-auth", client)
    print(f"mlx: serving {name} at {url}", file=out)
    print("Point a client at it with:\n", file=out)
    print(export_lines(launch_variables(target)), file=out)
    print("\nWatch it live from another terminal: mlx dash", file=out)
    print("\nPress Ctrl-C to stop.", file=out, flush=True)
