"""One call that serves a model for `mlx serve` and `mlx launch <agent>`: here, or on a cluster.

`served()` is the only place that chooses between the two. Without a cluster the engine and
server run in this process (launch/serving.py); with one, the ranks run under `mlx.launch`
and this process watches them (launch/cluster_serve.py), told the same things through one
rank spec built here from the same server settings and `EngineOptions`. Both yield an object
with the same face (`model`, `url`, `client`, `context_window`, `running()`,
`stopping_note()`, `failure`), so neither command has a branch of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console

from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.engine.config import LogitsHook
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.child import terminating_like_ctrl_c
from mlxlaunch.launch.claude_env import client_settings
from mlxlaunch.launch.cluster_commands import checked_parallel, describe
from mlxlaunch.launch.cluster_rank import RankSpec
from mlxlaunch.launch.cluster_serve import RANK_MODULE, ClusterServed, cluster_serving
from mlxlaunch.launch.models import ChosenModel
from mlxlaunch.launch.options import EngineOptions
from mlxlaunch.launch.serving import ModelLoad, Serving, serving
from mlxlaunch.launch.state import ClientSettings, RunKind
from mlxlaunch.server.app import ServerSettings

Served = Serving | ClusterServed


@contextlib.contextmanager
def served(
    model: ChosenModel,
    engine_options: EngineOptions,
    settings: ServerSettings,
    *,
    kind: RunKind,
    console: Console,
    cluster: Cluster | None = None,
    load: ModelLoad = "now",
    log_file: Path | None = None,
    log_level: str = "warning",
    logits_hook: LogitsHook | None = None,
    small_model: str | None = None,
    also: Sequence[str] = (),
    max_output_tokens: int | None = None,
    rank_command: tuple[str, ...] | None = None,
) -> Iterator[Served]:
    """Serve `model` for the duration of the block, here or on `cluster`, then stop it all.

    The arguments are `serving()`'s (launch/serving.py); `cluster` spreads the serve over its
    hosts (every check is made before a rank starts), and `rank_command` is how the ranks
    start (tests script rank 0). The ranks' output goes to `log_file`, else to `console`.

    Raises:
        ConfigError: a bad engine setting, a port that is taken, or a cluster that fails a
            check.
        ClusterFailed: the ranks did not get ready.
    """
    if cluster is None:
        with serving(
            model,
            engine_options,
            settings,
            kind=kind,
            console=console,
            load=load,
            log_file=log_file,
            log_level=log_level,
            logits_hook=logits_hook,
            small_model=small_model,
            also=also,
            max_output_tokens=max_output_tokens,
        ) as here:
            yield here
        return
    if also:
        raise ConfigError("several models are served on one machine only (no --hosts)")
    engine_options.check_for_cluster()
    parallel = checked_parallel(cluster, model.name)
    spec = RankSpec(
        model=model.name,
        parallel=parallel,
        kind=kind,
        engine=engine_options,
        host=settings.host,
        port=settings.port,
        auth_token=settings.auth_token,
        allow_remote=settings.allow_remote,
        allowed_origins=tuple(settings.allowed_origins),
        model_id=settings.model_id,
        small_model=small_model,
        max_output_tokens=max_output_tokens,
        log_file=str(log_file) if log_file else None,
        supervisor_pid=os.getpid(),
    )

    def client_for(window: int) -> ClientSettings:
        return client_settings(
            settings.model_id or model.served_id,
            window,
            small_model_id=small_model,
            max_output=max_output_tokens,
        )

    with contextlib.ExitStack() as stack:
        if log_file is None:

            def relay(line: str) -> None:
                console.print(line, markup=False, highlight=False)

        else:
            log = stack.enter_context(log_file.open("a", encoding="utf-8"))

            def relay(line: str) -> None:
                log.write(line + "\n")
                log.flush()

        relay(f"mlx: serving {model.name} on {describe(cluster, parallel)}")
        stack.enter_context(terminating_like_ctrl_c())
        yield stack.enter_context(
            cluster_serving(
                model, cluster, spec, relay, client_for, rank_command=rank_command or RANK_MODULE
            )
        )
