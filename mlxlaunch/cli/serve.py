"""`mlx serve`: options → ServeOptions → launch/serve.py, which does the serving."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxlaunch.cli.app import overrides
from mlxlaunch.cli.cluster_options import (
    BackendOption,
    HostfileOption,
    HostsOption,
    ParallelOption,
)
from mlxlaunch.cli.consoles import stderr_console
from mlxlaunch.cli.engine_options import ENGINE_DEFAULTS, takes_engine_options
from mlxlaunch.cli.options import MODEL_METAVAR, model_option
from mlxlaunch.cli.scheduler_options import ServeContextLengthOption
from mlxlaunch.launch.options import EngineOptions, ServeOptions

SERVE_HELP = """Serve a model under the Anthropic Messages API (POST /v1/messages).

Prints the URL and the environment a client needs, logs one line per request, and stops \
cleanly on Ctrl-C. Without --auth-token a fresh random token is made and printed.

Examples:

  mlx serve --model demo

  mlx serve --model qwen-coder-7b --port 8080 --auth-token secret

  mlx serve --model ./my-mlx-model --context-length 32768

  mlx serve --model qwen3-coder-30b --small-model qwen3-4b

  mlx serve --model demo --host 0.0.0.0 --allow-remote

  mlx serve --model qwen-coder-7b --hosts 127.0.0.1,10.0.0.2
"""

_console = stderr_console()


@takes_engine_options(replaced={"context_length": ServeContextLengthOption})
def serve(
    ctx: typer.Context,
    model: Annotated[
        list[str],
        model_option(
            "Alias, repo id, local path, or `demo`; repeat to serve several (the first is the "
            "main model, which serves every id no other model is named by)."
        ),
    ],
    small_model: Annotated[
        str | None,
        typer.Option(
            "--small-model",
            metavar=MODEL_METAVAR,
            help="A small model served beside the main one for Claude Code's haiku tier "
            "(titles, summaries, background work).",
        ),
    ] = None,
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
    engine: EngineOptions = ENGINE_DEFAULTS,  # every engine option (cli/engine_options.py)
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
    hosts: HostsOption = None,
    hostfile: HostfileOption = None,
    backend: BackendOption = None,
    parallel: ParallelOption = "auto",
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
    # The engine (and mlx) load only when serving, keeping every other `mlx` command quick.
    from mlxlaunch.cluster.hosts import cluster_from_options
    from mlxlaunch.launch.serve import serve_model

    options = ServeOptions(
        model=model[0],
        also=tuple(model[1:]),
        small_model=small_model,
        host=host,
        port=port,
        auth_token=auth_token,
        no_auth=no_auth,
        allow_remote=allow_remote,
        allowed_origins=tuple(allow_origin or ()),
        preload=preload,
        cluster=cluster_from_options(hosts, hostfile, backend=backend, parallel=parallel),
        engine=engine,
    )
    given = overrides(ctx)
    serve_model(
        options,
        console=_console,
        logits_hook=given.logits_hook,
        rank_command=given.rank_command,
    )
