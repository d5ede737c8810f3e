"""One rank of a cluster serve, as `mlx.launch` starts it on each host.

    python -m mlxlaunch.launch.cluster_rank      (the spec in MLXLAUNCH_CLUSTER_SPEC)

The spec (`RankSpec`, base64 JSON in the environment) says what to serve and how; the server's
token is not in it but in rank 0's own environment (rank 0 runs on the launching machine), so
it is on no command line, local or remote. The spec does say that the launch has a token
(`auth_required`): a rank 0 that finds none in its environment (started over ssh, where the
environment does not travel) refuses to start rather than serve without authentication.
Every rank first checks that all ranks run the same mlx, mlx-lm and mlxlaunch on the same
model files, and refuses to start otherwise. Rank 0 then
serves HTTP with the engine leading the lockstep (engine/scheduling/lockstep.py) and announces
itself on stdout (`READY_MARK`, read by launch/cluster_serve.py); every other rank follows
(engine/scheduling/follower.py) until rank 0 says stop or a rank is lost.
"""

from __future__ import annotations

import base64
import dataclasses
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Light (no MLX): mlx.launch starts this module on every host, which reads the spec first.
from mlxlaunch.launch.options import EngineOptions

SPEC_VARIABLE = "MLXLAUNCH_CLUSTER_SPEC"
TOKEN_VARIABLE = "MLXLAUNCH_CLUSTER_TOKEN"  # rank 0's alone, never on a command line
READY_MARK = "MLXLAUNCH-CLUSTER-READY "  # + JSON: url, context_window, pid
MISMATCH_EXIT = 2  # the ranks differ (versions, model files): refused before loading
LOST_EXIT = 3  # a rank was lost while serving
NO_TOKEN_EXIT = 4  # the launch has a token and rank 0 did not get it: refused, never open


@dataclass(frozen=True)
class RankSpec:
    """What every rank of one cluster serve is told."""

    model: str  # the name as the user gave it (each host resolves it in its own store)
    parallel: str  # "tensor" or "pipeline", decided before the ranks start
    kind: str = "serve"  # what rank 0's state file says: "serve" or "launch"
    engine: EngineOptions = field(default_factory=EngineOptions)
    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str | None = None
    # The launch has a token (the public spec leaves the token out, never this): rank 0
    # refuses to serve when its environment does not bring it.
    auth_required: bool = False
    allow_remote: bool = False
    allowed_origins: tuple[str, ...] = ()
    model_id: str | None = None
    small_model: str | None = None
    max_output_tokens: int | None = None
    log_file: str | None = None  # what the state file names as the server log
    supervisor_pid: int | None = None  # the `mlx` that started the ranks: they end with it

    def encoded(self) -> str:
        data = {**dataclasses.asdict(self), "engine": self.engine.as_json()}
        return base64.b64encode(json.dumps(data).encode()).decode()

    @classmethod
    def decoded(cls, text: str) -> RankSpec:
        data = json.loads(base64.b64decode(text.encode()).decode())
        data["allowed_origins"] = tuple(data.get("allowed_origins") or ())
        data["engine"] = EngineOptions.from_json(data.get("engine") or {})
        return cls(**data)


def identity(model_dir: Path) -> str:
    """What must be equal on every rank: the versions that compute, and the model's files."""
    from mlxlaunch.cluster.probe import fingerprint, model_files, package_versions

    versions = package_versions()
    wanted = ("mlx", "mlx-lm", "mlxlaunch")
    named = " ".join(f"{name} {versions.get(name) or '?'}" for name in wanted)
    return f"{named}; model {fingerprint(model_dir, model_files(model_dir))[:16]}"


def main() -> int:
    return run_from_environment()


def run_from_environment(logits_hook: Any = None) -> int:
    """Run the rank the environment describes (`logits_hook`: rank 0's scripted output, for
    tests; the product passes none)."""
    text = os.environ.get(SPEC_VARIABLE)
    if not text:
        print(
            f"{SPEC_VARIABLE} is not set: this runs as a rank of `mlx serve --hosts`",
            file=sys.stderr,
        )
        return 2
    spec = RankSpec.decoded(text)
    token = os.environ.pop(TOKEN_VARIABLE, None)
    spec = dataclasses.replace(spec, auth_token=token or spec.auth_token)
    # At once, before mlx loads or the ranks connect (mlx.launch says the rank in MLX_RANK;
    # without it, this is taken for rank 0): run_rank checks again with the joined group.
    if (refusal := missing_token(spec, int(os.environ.get("MLX_RANK") or 0))) is not None:
        print(refusal, file=sys.stderr, flush=True)
        return NO_TOKEN_EXIT  # mlx.launch then stops the other ranks
    return run_rank(spec, logits_hook)


def missing_token(spec: RankSpec, rank: int) -> str | None:
    """Why this rank must not start (rank 0 of a launch with a token that did not reach it),
    or None."""
    if rank != 0 or not spec.auth_required or spec.auth_token:
        return None
    return (
        f"mlx: rank 0 got no server token ({TOKEN_VARIABLE}) although the launch has one: it "
        "was started over ssh, where the token does not travel; refusing to serve without "
        "authentication (rank 0 must be this machine, written 127.0.0.1)"
    )


def run_rank(spec: RankSpec, logits_hook: Any = None) -> int:
    """Run this process's rank of `spec`; its exit code."""
    from mlxlaunch.engine.config import ClusterRole, EngineConfig
    from mlxlaunch.engine.engine import follow, join_cluster
    from mlxlaunch.engine.types import ClusterLost
    from mlxlaunch.launch.models import ChosenModel

    # A rank stuck in a collective says where on SIGUSR1 (`kill -USR1 <pid>`): a hang across
    # machines is otherwise silent.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    group = join_cluster()
    if (refusal := missing_token(spec, group.rank)) is not None:
        print(refusal, file=sys.stderr, flush=True)
        return NO_TOKEN_EXIT  # mlx.launch then stops the other ranks
    logging.basicConfig(level=logging.INFO, format=f"rank {group.rank}: %(levelname)s %(message)s")
    path = rank_model_dir(spec.model)
    try:
        identities = group.gather_text(identity(path))
    except ClusterLost as exc:
        print(f"rank {group.rank}: {exc}", file=sys.stderr)
        return LOST_EXIT
    if len(set(identities)) > 1:
        if group.leads:
            lines = "\n".join(f"  rank {r}: {ident}" for r, ident in enumerate(identities))
            print(
                f"mlx: the ranks differ, so they cannot serve one model:\n{lines}",
                file=sys.stderr,
                flush=True,
            )
        return MISMATCH_EXIT
    options = spec.engine
    role = ClusterRole(group, spec.parallel)  # type: ignore[arg-type]
    if not group.leads:
        config = EngineConfig(model=str(path), cluster=role, **options.config_arguments())
        return follow(config)
    return _serve(spec, ChosenModel(spec.model, path, "--model"), options, role, logits_hook)


def rank_model_dir(name: str) -> Path:
    """The model on this host: a test model (built if need be), else the store's copy, which
    may be a shard pull holding only this host's layers (`mlx models pull --shard`)."""
    from mlxlaunch.launch.models import is_test_model_name, resolve_name
    from mlxlaunch.store.resolve import resolve_model

    if is_test_model_name(name):
        return resolve_name(name)
    return resolve_model(name, record_use=True, shard_ok=True).path


def _serve(spec: RankSpec, model: Any, options: EngineOptions, role: Any, logits_hook: Any) -> int:
    """Rank 0: serve until told to stop (SIGTERM, SIGINT) or until a rank is lost."""
    from rich.console import Console

    from mlxlaunch.engine.types import ClusterLost
    from mlxlaunch.launch.serving import serving
    from mlxlaunch.runstate import pid_alive
    from mlxlaunch.server.app import ServerSettings

    settings = ServerSettings(
        host=spec.host,
        port=spec.port,
        auth_token=spec.auth_token,
        allow_remote=spec.allow_remote,
        allowed_origins=spec.allowed_origins,
        model_id=spec.model_id,
    )
    console = Console(stderr=True)
    ended_under_us = False

    def another_rank_ended(_signum: int, _frame: object) -> None:
        # The supervisor stops rank 0 with SIGINT (and `mlx stop` signals the supervisor):
        # SIGTERM here is mlx.launch ending the cluster because another rank ended.
        nonlocal ended_under_us
        ended_under_us = True
        raise KeyboardInterrupt

    lost: BaseException | None = None
    try:
        with serving(
            model,
            options,
            settings,
            kind=spec.kind,  # type: ignore[arg-type]
            console=console,
            load="now",
            log_file=Path(spec.log_file) if spec.log_file else None,
            log_level="info" if spec.kind == "launch" else "warning",
            logits_hook=logits_hook,
            small_model=spec.small_model,
            max_output_tokens=spec.max_output_tokens,
            cluster=role,
            state_pid=spec.supervisor_pid,
        ) as served:
            signal.signal(signal.SIGTERM, another_rank_ended)  # serving() restores its own
            ready = {
                "url": served.url,
                "context_window": served.context_window,
                "pid": os.getpid(),
            }
            print(READY_MARK + json.dumps(ready), flush=True)
            try:
                while served.server.running and served.engine.lost is None:
                    if spec.supervisor_pid is not None and not pid_alive(spec.supervisor_pid):
                        # Killed outright (SIGKILL), it could not stop us: we stop ourselves,
                        # and tell the other ranks, rather than serve for nobody.
                        print("mlx: the launching process is gone; stopping", file=sys.stderr)
                        break
                    time.sleep(0.2)
            except KeyboardInterrupt:
                pass
            lost = served.engine.lost or (
                ClusterLost("another rank of the cluster ended") if ended_under_us else None
            )
            if lost is not None:
                _end_lost(served, lost, spec.supervisor_pid)
    except KeyboardInterrupt:
        pass
    return 0


def _end_lost(served: Any, lost: BaseException, state_pid: int | None) -> None:
    """A rank is gone: answer every request in flight now, and exit at once.

    MLX does not return from a collective whose peer died mid-step (the ring backend fails
    its sends but the evaluation waits on), so the worker thread cannot be joined, nor the
    engine closed: the process ends here."""
    from mlxlaunch.launch.state import remove_state

    message = f"{lost}; the cluster has stopped"
    served.server.cut_off(message)
    time.sleep(0.5)  # the answers go out on the server's own thread
    remove_state(state_pid or os.getpid())
    print(f"mlx: {message}", file=sys.stderr, flush=True)
    os._exit(LOST_EXIT)


if __name__ == "__main__":
    sys.exit(main())
