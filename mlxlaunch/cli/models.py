"""`mlx models …`: pull, list, info, rm, add, catalog and recommend local MLX models.

Every command is a thin shell over `mlxlaunch.store`; failures are typed errors that
`cli/main.py` turns into one-line messages, and how models look is `cli/model_views.py`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from mlxlaunch.cli.consoles import stderr_console, stdout_console
from mlxlaunch.cli.error_text import error_text
from mlxlaunch.cli.model_views import (
    catalog_json,
    info_fields,
    info_json,
    print_catalog,
    print_info,
    print_local_models,
    recommendation_json,
)
from mlxlaunch.cli.options import MODEL_METAVAR, JsonOption
from mlxlaunch.cluster.architecture import parallel_mode
from mlxlaunch.cluster.hosts import (
    PARALLEL_MODES,
    is_local,
    parse_hosts,
    read_hostfile,
    ssh_argv,
)
from mlxlaunch.cluster.remote_text import printable
from mlxlaunch.errors import ConfigError, MlxLaunchError, ModelNotFound
from mlxlaunch.launch.models import (
    DEMO_MODEL,
    is_test_model_name,
    notice_for_test_model,
    offline_model_dir,
    offline_model_names,
)
from mlxlaunch.store.catalog import CATALOG, catalog_entry
from mlxlaunch.store.compute import BACKENDS, Compute, this_machine
from mlxlaunch.store.facts import read_facts
from mlxlaunch.store.inventory import (
    LocalModel,
    find_local,
    list_models,
    local_model_names,
    snapshot_complete,
)
from mlxlaunch.store.memory import GIB, format_bytes
from mlxlaunch.store.registry import register_local
from mlxlaunch.store.shards import (
    ShardSpec,
    layer_range,
    parse_shard,
    pipeline_split,
)

if TYPE_CHECKING:
    from mlxlaunch.store.pull import PullPlan

# Pulling and removing need the hub client (huggingface_hub, httpx: ~0.3 s to import): they
# are imported by the commands that use them, so `mlx --help` and completion do not wait.

models_app = typer.Typer(
    name="models",
    help=(
        "Manage local MLX models (the Hugging Face hub cache).\n\n"
        "Examples:\n\n"
        "  mlx models recommend\n\n"
        "  mlx models pull qwen-coder-7b\n\n"
        "  mlx models list --json\n\n"
        "  mlx models rm qwen-coder-7b --yes"
    ),
    no_args_is_help=True,
)

TEST_MODEL_NOTE = "test model: built offline on first use, nothing to download or pull"

_err = stderr_console()

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
MemoryOpt = Annotated[
    float | None,
    typer.Option("--memory", help="Judge for this machine with this many GiB (default: its own)."),
]
ModelArg = Annotated[
    str,
    typer.Argument(
        metavar=MODEL_METAVAR,
        help="Alias, repo id, or name given to `mlx models add`.",
    ),
]


def _gib(memory: float | None) -> int | None:
    if memory is None:
        return None
    if memory <= 0:
        raise ConfigError("--memory must be a positive number of GiB")
    return int(memory * GIB)


HostsOpt = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Pull onto these machines (ssh names or IPs, comma-separated, in rank order); "
        "with pipeline parallelism each fetches only its ranks' files.",
    ),
]
HostfileOpt = Annotated[
    Path | None, typer.Option("--hostfile", help="An MLX hostfile naming the machines.")
]
ParallelOpt = Annotated[
    str,
    typer.Option(
        "--parallel",
        help="How the model will be split: auto, tensor (every host needs every file) or "
        "pipeline (each host its layers' files).",
    ),
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="R/N",
        help="Only the files pipeline rank R of N loads (R may list ranks: 0,1/3).",
    ),
]
PythonOpt = Annotated[
    str | None,
    typer.Option("--python", help="Python with mlxlaunch on the other hosts (default: this one)."),
]


@models_app.command("pull", short_help="Download a model into the hub cache.")
def pull_command(
    name: Annotated[
        str,
        typer.Argument(
            metavar=MODEL_METAVAR,
            help="Catalog alias or hub repo id (org/name).",
        ),
    ],
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch, tag or commit.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Download even a repo MLX cannot load.")
    ] = False,
    shard: ShardOpt = None,
    hosts: HostsOpt = None,
    hostfile: HostfileOpt = None,
    parallel: ParallelOpt = "auto",
    python: PythonOpt = None,
) -> None:
    """Download a model's MLX files into the hub cache (resumable), then check it loads.

    With --hosts (or --hostfile) every machine of a cluster pulls, in parallel: for
    pipeline parallelism each only its ranks' weight files, as mlx-lm's sharded_load loads
    them; other hosts over ssh, running `PYTHON -m mlxlaunch models pull MODEL --shard R/N`.

    Examples:

      mlx models pull qwen-coder-7b

      mlx models pull mlx-community/Qwen3-8B-4bit --revision main

      mlx models pull qwen3-coder-30b --hosts 10.0.0.1,10.0.0.2

      mlx models pull qwen3-coder-30b --parallel pipeline --hostfile hosts.json

      mlx models pull qwen3-coder-30b --shard 1/2
    """
    if parallel not in PARALLEL_MODES:
        raise ConfigError(f"--parallel {parallel!r}: one of {', '.join(PARALLEL_MODES)}")
    if hosts is not None or hostfile is not None:
        if shard is not None:
            raise ConfigError("--shard is one host's part; --hosts gives each host its ranks")
        _pull_on_hosts(name, revision, force, hosts, hostfile, parallel, python)
        return
    if python is not None:
        raise ConfigError("--python is for the other hosts of --hosts or --hostfile")
    if shard is not None and parallel == "tensor":
        raise ConfigError("--shard takes pipeline ranks: with --parallel tensor pull it whole")
    if shard is None and parallel != "auto":
        raise ConfigError("--parallel needs --hosts, --hostfile or --shard")
    _pull_here(name, revision, force, parse_shard(shard) if shard else None)


def _pull_here(
    name: str, revision: str | None, force: bool, shard: ShardSpec | None, where: str = ""
) -> None:
    """Plan, report and run one pull into this machine's cache (of `shard`'s ranks only)."""
    from mlxlaunch.store.progress import RichPullProgress
    from mlxlaunch.store.pull import plan_pull, pull

    plan = plan_pull(name, revision=revision, shard=shard)
    label = plan.alias or plan.repo_id
    lead = f"{where}: " if where else ""
    _err.print(
        f"{lead}[bold]{plan.repo_id}[/] @ {plan.commit[:10]}: {len(plan.files)} files, "
        f"{format_bytes(plan.total_bytes)} ({len(plan.skipped)} non-MLX files skipped)",
        highlight=False,
    )
    if plan.shard is not None:
        _err.print(f"{lead}{_shard_summary(plan, plan.shard)}", highlight=False)
    _err.print(f"{lead}memory: {plan.fit.describe()}", highlight=False)
    for problem in plan.problems:
        _err.print(f"{lead}[yellow]problem:[/] {problem}", highlight=False)
    result = pull(plan, progress=RichPullProgress(_err, label=label), force=force)
    for note in result.report.notes:
        _err.print(f"{lead}[dim]note:[/] {note}", highlight=False)
    if not result.report.ok:
        for problem in result.report.problems:
            _err.print(f"{lead}[red]check failed:[/] {problem}", highlight=False)
        raise typer.Exit(4)
    _err.print(f"{lead}[green]ready:[/] {label} → {result.path}", highlight=False)


def _shard_summary(plan: PullPlan, shard: ShardSpec) -> str:
    spans = []
    for rank in shard.ranks:
        start, end = layer_range(plan.config, rank, shard.size)
        layers = f"layer {start}" if end - start == 1 else f"layers {start}–{end - 1}"
        spans.append(f"rank {rank}: {layers}")
    return (
        f"shard {shard.label} ({', '.join(spans)}); "
        f"{len(plan.other_ranks)} weight files of other ranks not fetched"
    )


def _pull_on_hosts(
    name: str,
    revision: str | None,
    force: bool,
    hosts: str | None,
    hostfile: Path | None,
    parallel: str,
    python: str | None,
) -> None:
    """Pull on every host of a cluster at once; any host's failure is reported by its name
    and makes the command exit non-zero once all have finished."""
    from mlxlaunch.store.pull import plan_pull

    if hosts is not None and hostfile is not None:
        raise ConfigError("give --hosts or --hostfile, not both")
    names = read_hostfile(hostfile)[0] if hostfile is not None else parse_hosts(hosts or "")
    size = len(names)
    plan = plan_pull(name, revision=revision)  # one commit for all, and the config
    mode = parallel_mode(plan.config, parallel)
    if mode == "pipeline":
        pipeline_split(plan.config, size)  # more ranks than layers: refused before any pull
    what = "its ranks' files" if mode == "pipeline" else "the whole model"
    _err.print(
        f"[bold]{plan.repo_id}[/] @ {plan.commit[:10]}: {mode} parallel on {size} ranks; "
        f"each host pulls {what}",
        highlight=False,
    )
    local = tuple(r for r, host in enumerate(names) if is_local(host))
    remote: dict[str, list[int]] = {}
    for rank, host in enumerate(names):
        if not is_local(host):
            remote.setdefault(host, []).append(rank)
    failures: dict[str, str] = {}
    remotes: list[tuple[str, subprocess.Popen[str], threading.Thread]] = []
    try:
        for host, ranks in remote.items():
            spec = ShardSpec(tuple(ranks), size) if mode == "pipeline" else None
            argv = _remote_pull_argv(host, name, plan.commit, force, spec, python)
            if (proc := _start_remote(host, argv, failures)) is not None:
                thread = threading.Thread(target=_show_remote, args=(host, proc, failures))
                thread.start()
                remotes.append((host, proc, thread))
        if local:
            spec = ShardSpec(local, size) if mode == "pipeline" else None
            try:
                _pull_here(name, plan.commit, force, spec, where="this machine")
            except MlxLaunchError as exc:
                message, hint = error_text(exc)
                failures["this machine"] = message + (f" ({hint})" if hint else "")
            except typer.Exit:
                failures["this machine"] = "the model failed its check after download"
        for _, _, thread in remotes:
            thread.join()
    finally:  # Ctrl-C here: no pull goes on running on another host
        for _, proc, thread in remotes:
            if proc.poll() is None:
                proc.terminate()
            thread.join()
    if failures:
        for host, message in failures.items():
            _err.print(Text.assemble((f"{host}: pull failed: ", "red"), message))
        raise typer.Exit(1)
    _err.print(f"[green]ready on {size} ranks:[/] {plan.alias or plan.repo_id}", highlight=False)


def _remote_pull_argv(
    host: str, name: str, commit: str, force: bool, shard: ShardSpec | None, python: str | None
) -> list[str]:
    """`ssh HOST 'PYTHON -m mlxlaunch models pull …'`, pinned to the commit this host planned
    (so every host gets the same files)."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise ConfigError("ssh is not installed: it starts the pulls on the other hosts")
    # COLUMNS: its lines are shown here under the host's name, not wrapped at 80.
    command = ["env", "COLUMNS=160", python or sys.executable, "-m", "mlxlaunch", "models"]
    command += ["pull", "--revision", commit]
    if force:
        command.append("--force")
    if shard is not None:
        command += ["--shard", shard.label]
    command += ["--", name]  # the name is never read as an option there
    return ssh_argv(host, command, ("-o", "BatchMode=yes"), ssh=ssh)


def _start_remote(
    host: str, argv: list[str], failures: dict[str, str]
) -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        failures[host] = f"cannot start ssh ({exc})"
        return None


def _show_remote(host: str, proc: subprocess.Popen[str], failures: dict[str, str]) -> None:
    """Show one host's pull line by line under the host's name, then judge how it ended."""
    tail = ""
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            if line := printable(line.rstrip()):  # another machine's text: no escapes
                tail = line
                _err.print(Text.assemble((f"{host}: ", "dim"), line))
    code = proc.wait()
    if code == 255:
        failures[host] = "ssh could not reach it (or log in without a password)"
    elif code != 0:
        failures[host] = f"exit code {code}" + (f": {tail}" if tail else "")


@models_app.command("list", short_help="List local models.")
def list_command(
    as_json: JsonOption = False,
    names: Annotated[
        bool, typer.Option("--names", help="Print only the names, one a line.")
    ] = False,
) -> None:
    """List local models: hub-cache downloads and directories added with `mlx models add`,
    then the offline test models (`demo` first), which need no download.

    Examples:

      mlx models list

      mlx models list --json

      mlx models list --names
    """
    if names:  # what shell completion runs on every TAB: names only, no weights read
        for name in local_model_names():
            typer.echo(name)
        return
    models = list_models()
    if as_json:
        typer.echo(json.dumps([m.as_json() for m in models], indent=2))
        return
    if not models:
        _err.print("No local models. Try: mlx models recommend", highlight=False)
    else:
        print_local_models(stdout_console(), models)
    _err.print(offline_models_line(), highlight=False)


def offline_models_line() -> str:
    """The test models, which `mlx models info` knows and which are never downloaded."""
    tests = [n for n in offline_model_names() if n != DEMO_MODEL]
    return (
        f"Offline, nothing to download: {DEMO_MODEL} (scripted replies and a real tool round "
        f"trip: mlx launch claude --model {DEMO_MODEL}); test models {', '.join(tests)} "
        "(random weights, for tests and mlx bench)"
    )


def _require(name: str) -> LocalModel:
    model = find_local(name)
    if model is None:
        pullable = catalog_entry(name) is not None or "/" in name
        hint = f"mlx models pull {name}" if pullable else "see mlx models list, mlx models catalog"
        raise ModelNotFound(f"no local model '{name}'", hint=hint)
    return model


def _test_model(name: str) -> tuple[dict[str, Any], LocalModel | None]:
    """`name`'s info document, and the model once it was built (None before)."""
    path = offline_model_dir(name)
    note = notice_for_test_model(name)
    if not (path / "config.json").is_file():
        return {"name": name, "test_model": True, "built": False, "path": str(path),
                "description": note}, None  # fmt: skip
    model = LocalModel(
        name=name,
        repo_id=None,
        alias=None,
        source="test",
        path=path,
        revision=None,
        refs=(),
        size_on_disk=sum(p.stat().st_size for p in path.rglob("*") if p.is_file()),
        complete=snapshot_complete(path),
        facts=read_facts(path),
        last_used=None,
    )
    return info_json(model, test_model=True) | {"built": True, "description": note}, model


@models_app.command("info", short_help="Everything known about a local model.")
def info_command(name: ModelArg, as_json: JsonOption = False) -> None:
    """Everything known about a local model: facts, template capabilities, files.

    Examples:

      mlx models info qwen-coder-7b

      mlx models info qwen-coder-7b --json

      mlx models info demo
    """
    heading = Text(name, style="bold")
    if is_test_model_name(name):
        data, model = _test_model(name)
        fields = [("kind", TEST_MODEL_NOTE), ("note", notice_for_test_model(name))]
        if model is None:
            fields += [("built", f"not yet: the first `mlx serve --model {name}` builds it"),
                       ("path", data["path"])]  # fmt: skip
        else:
            skip = ("alias", "repo", "source", "revision", "last used")
            fields += [f for f in info_fields(data) if f[0] not in skip]
    else:
        data = info_json(_require(name)) | {"test_model": False}
        fields = info_fields(data)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    print_info(stdout_console(), heading, fields)


@models_app.command("rm", short_help="Remove a local model and free its files.")
def rm_command(name: ModelArg, yes: YesOpt = False) -> None:
    """Remove a model and free its files (refused while a running server has it loaded).

    Examples:

      mlx models rm qwen-coder-7b

      mlx models rm my-model --yes
    """
    from mlxlaunch.store.remove import execute_removal, plan_removal

    removal = plan_removal(name)
    what = (
        f"delete {removal.name} ({format_bytes(removal.freed_bytes)}) from {removal.target}"
        if removal.deletes_files
        else f"forget local model {removal.name} (its directory {removal.target} is kept)"
    )
    if not yes and not typer.confirm(what[0].upper() + what[1:] + "?", err=True):
        raise typer.Abort()
    freed = execute_removal(removal)
    _err.print(f"removed {removal.name}; freed {format_bytes(freed)}", highlight=False)


@models_app.command("add", short_help="Register a local model directory.")
def add_command(
    path: Annotated[Path, typer.Argument(help="A model directory (config.json + weights).")],
    name: Annotated[
        str | None, typer.Option("--name", help="Name to use (default: dir name).")
    ] = None,
) -> None:
    """Register a local model directory so `--model NAME` finds it.

    Examples:

      mlx models add ./my-mlx-model

      mlx models add ~/models/Qwen3-8B-4bit --name qwen-local
    """
    directory = path.expanduser().resolve()
    if not snapshot_complete(directory):
        problems = read_facts(directory).problems() or ["missing weight shards"]
        raise ModelNotFound(f"{directory} is not a loadable model: " + "; ".join(problems))
    register_local(name or directory.name, directory)
    _err.print(f"added {name or directory.name} → {directory}", highlight=False)


@models_app.command("catalog", short_help="Well-known models, by alias.")
def catalog_command(as_json: JsonOption = False) -> None:
    """Aliases for well-known MLX models that handle Claude Code's tools well.

    Examples:

      mlx models catalog

      mlx models catalog --json
    """
    if as_json:
        typer.echo(json.dumps(catalog_json(CATALOG), indent=2))
        return
    print_catalog(stdout_console(), CATALOG)


def _compute(backend: str | None) -> Compute:
    here = this_machine()
    if backend is None:
        return here
    chosen = next((b for b in BACKENDS if b == backend), None)
    if chosen is None:
        raise ConfigError(f"--compute {backend!r}: one of {', '.join(BACKENDS)}")
    return Compute(chosen, here.cores)


@models_app.command("recommend", short_help="The best catalog model for this machine.")
def recommend_command(
    memory: MemoryOpt = None,
    kind: Annotated[str | None, typer.Option("--kind", help="coder, general or vision.")] = None,
    compute: Annotated[
        str | None,
        typer.Option(
            "--compute", help="Judge for metal, cuda or cpu (default: what MLX uses here)."
        ),
    ] = None,
    small: Annotated[
        bool,
        typer.Option(
            "--small",
            help="A small model for Claude Code's haiku tier that fits beside the main one "
            "(--small-model), both counted.",
        ),
    ] = False,
    beside: Annotated[
        str | None,
        typer.Option(
            metavar="ALIAS", help="With --small: the main model (default: the one recommended)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The best catalog model that fits this machine's memory and runs at a usable speed on
    its compute (on a CPU-only machine, models too slow to answer in time are passed over).

    Prints `ALIAS<tab>REPO` (details on stderr), or one JSON document with --json.

    Examples:

      mlx models recommend

      mlx models recommend --memory 32 --kind coder

      mlx models recommend --memory 64 --compute metal

      mlx models recommend --small --beside qwen3-coder-30b

      mlx models pull "$(mlx models recommend | cut -f1)"
    """
    data = recommendation_json(_gib(memory), kind, _compute(compute), small=small, beside=beside)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"{data['alias']}\t{data['repo_id']}")
    size = format_bytes(data["size_bytes"])
    _err.print(f"{size} download, {data['context_window']:,}-token context", highlight=False)
    if small:
        _err.print(f"beside {data['beside']} (both counted)", highlight=False)
    _err.print(f"memory: {data['memory']}", highlight=False)
    _err.print(f"context: {data['context_here_text']}", highlight=False)
    if data["speed_rule"]:
        _err.print(f"speed: {data['speed_rule']}", highlight=False)
    _err.print(f"pull it with: {data['pull_command']}", highlight=False)
