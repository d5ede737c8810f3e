"""`mlx models …`: pull, list, info, rm, add, catalog and recommend local MLX models.

Every command is a thin shell over `mlxlaunch.store`; failures are typed errors that
`cli/main.py` turns into one-line messages.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlxlaunch.errors import ConfigError, ModelNotFound
from mlxlaunch.store import (
    CATALOG,
    LocalModel,
    execute_removal,
    find_local,
    list_models,
    plan_pull,
    plan_removal,
    pull,
    read_facts,
    recommend,
    register_local,
    snapshot_complete,
)
from mlxlaunch.store.facts import read_chat_template, template_features
from mlxlaunch.store.memory import GIB, format_bytes, memory_fit
from mlxlaunch.store.progress import RichPullProgress

app = typer.Typer(
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

_out = Console()
_err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
MemoryOpt = Annotated[
    float | None,
    typer.Option("--memory", help="Judge for a machine with this many GiB (default: this one)."),
]


def _gib(memory: float | None) -> int | None:
    if memory is None:
        return None
    if memory <= 0:
        raise ConfigError("--memory must be a positive number of GiB")
    return int(memory * GIB)


def _params(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _ago(ts: float | None) -> str:
    if not ts:
        return "never"
    minutes = (time.time() - ts) / 60
    for limit, unit, div in ((60, "min", 1), (48 * 60, "h", 60), (float("inf"), "d", 1440)):
        if minutes < limit:
            return f"{minutes / div:.0f} {unit} ago"
    return "?"


@app.command("pull")
def pull_command(
    name: Annotated[str, typer.Argument(help="Catalog alias or hub repo id (org/name).")],
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch, tag or commit.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Download even a repo MLX cannot load.")
    ] = False,
) -> None:
    """Download a model's MLX files into the hub cache (resumable), then check it loads."""
    plan = plan_pull(name, revision=revision)
    label = plan.alias or plan.repo_id
    _err.print(
        f"[bold]{plan.repo_id}[/] @ {plan.commit[:10]}: {len(plan.files)} files, "
        f"{format_bytes(plan.total_bytes)} ({len(plan.skipped)} non-MLX files skipped)",
        highlight=False,
    )
    _err.print(f"memory: {plan.fit.describe()}", highlight=False)
    for problem in plan.problems:
        _err.print(f"[yellow]problem:[/] {problem}", highlight=False)
    result = pull(plan, progress=RichPullProgress(_err, label=label), force=force)
    for note in result.report.notes:
        _err.print(f"[dim]note:[/] {note}", highlight=False)
    if not result.report.ok:
        for problem in result.report.problems:
            _err.print(f"[red]check failed:[/] {problem}", highlight=False)
        raise typer.Exit(4)
    _err.print(f"[green]ready:[/] {label} → {result.path}", highlight=False)


def _model_table(models: list[LocalModel]) -> Table:
    table = Table(title="Local MLX models")
    for column in ("name", "repo", "rev", "size", "bits", "params", "context", "tools",
                   "thinking", "last used"):  # fmt: skip
        table.add_column(column, no_wrap=column in ("name", "repo", "size"))
    for m in models:
        f = m.facts
        name = m.name if m.complete else f"{m.name} [yellow](incomplete)[/]"
        table.add_row(
            name,
            m.repo_id or str(m.path),
            (m.revision or "")[:8] or "local",
            format_bytes(m.size_on_disk),
            str(f.quant_bits) if f.quant_bits else (f.dtype or "?"),
            _params(f.param_count),
            f"{f.context_window:,}" if f.context_window else "?",
            f.tool_format or "-",
            "yes" if f.thinking else "no",
            _ago(m.last_used),
        )
    return table


@app.command("list")
def list_command(as_json: JsonOpt = False) -> None:
    """List local models: hub-cache downloads and directories added with `mlx models add`."""
    models = list_models()
    if as_json:
        typer.echo(json.dumps([m.as_json() for m in models], indent=2))
        return
    if not models:
        _err.print("No local models. Try: mlx models recommend")
        return
    _out.print(_model_table(models))


def _require(name: str) -> LocalModel:
    model = find_local(name)
    if model is None:
        raise ModelNotFound(f"no local model '{name}'", hint=f"mlx models pull {name}")
    return model


@app.command("info")
def info_command(name: str, as_json: JsonOpt = False) -> None:
    """Everything known about a local model: facts, template capabilities, files."""
    model = _require(name)
    template = read_chat_template(model.path)
    features = template_features(template)
    files = sorted(p.name for p in model.path.iterdir())
    data = model.as_json() | {
        "problems": model.facts.problems(),
        "template_features": features.names(),
        "files": files,
        "memory": memory_fit(model.facts.weights_bytes).describe(),
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(show_header=False, title=model.name)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in data.items():
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        elif key == "size_on_disk":
            value = format_bytes(int(value))
        table.add_row(key, str(value))
    _out.print(table)


@app.command("rm")
def rm_command(name: str, yes: YesOpt = False) -> None:
    """Remove a model and free its files (refused while a running server has it loaded)."""
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


@app.command("add")
def add_command(
    path: Annotated[Path, typer.Argument(help="A model directory (config.json + weights).")],
    name: Annotated[
        str | None, typer.Option("--name", help="Name to use (default: dir name).")
    ] = None,
) -> None:
    """Register a local model directory so `--model NAME` finds it."""
    directory = path.expanduser().resolve()
    if not snapshot_complete(directory):
        problems = read_facts(directory).problems() or ["missing weight shards"]
        raise ModelNotFound(f"{directory} is not a loadable model: " + "; ".join(problems))
    register_local(name or directory.name, directory)
    _err.print(f"added {name or directory.name} → {directory}", highlight=False)


@app.command("catalog")
def catalog_command(as_json: JsonOpt = False) -> None:
    """Aliases for well-known MLX models that handle Claude Code's tools well."""
    if as_json:
        typer.echo(json.dumps([
            {"alias": e.alias, "repo_id": e.repo_id, "kind": e.kind, "bits": e.bits,
             "size_bytes": e.size_bytes, "context_window": e.context_window,
             "memory_bytes": e.memory_bytes}
            for e in CATALOG
        ], indent=2))  # fmt: skip
        return
    table = Table(title="Catalog (mlx models pull ALIAS)")
    for column in ("alias", "repo", "kind", "params", "bits", "size", "context", "memory"):
        table.add_column(column, no_wrap=column in ("alias", "repo", "size"))
    for e in CATALOG:
        table.add_row(e.alias, e.repo_id, e.kind, e.params, str(e.bits),
                      format_bytes(e.size_bytes), f"{e.context_window:,}",
                      format_bytes(e.memory_bytes))  # fmt: skip
    _out.print(table)


@app.command("recommend")
def recommend_command(
    memory: MemoryOpt = None,
    kind: Annotated[str | None, typer.Option("--kind", help="coder or general.")] = None,
) -> None:
    """The best catalog model that fits this machine's memory."""
    entry = recommend(_gib(memory), kind=kind)
    if entry is None:
        raise ConfigError("no catalog model fits this machine's memory")
    typer.echo(f"{entry.alias}\t{entry.repo_id}")
    _err.print(
        f"{format_bytes(entry.size_bytes)} download, {entry.context_window:,}-token context, "
        f"{memory_fit(entry.size_bytes, _gib(memory)).describe()}\n"
        f"pull it with: mlx models pull {entry.alias}",
        highlight=False,
    )
