"""The engine options are declared once (cli/engine_options.py) and every serving command
takes all of them; they reach `EngineOptions` and the rank spec of a cluster as one record."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.testing

from mlxlaunch.cli.engine_options import ENGINE_OPTIONS, takes_engine_options
from mlxlaunch.cli.main import app
from mlxlaunch.launch.cluster_rank import RankSpec
from mlxlaunch.launch.options import EngineOptions

FIELDS = [f.name for f in dataclasses.fields(EngineOptions)]


def _params(path: tuple[str, ...]) -> dict[str, Any]:
    command = typer.main.get_command(app)
    for name in path:
        command = command.get_command(None, name)  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_engine_option_has_one_declaration() -> None:
    assert list(ENGINE_OPTIONS) == FIELDS


@pytest.mark.parametrize(
    "path", [("serve",), ("launch", "claude"), ("launch", "codex"), ("launch", "opencode")]
)
def test_every_serving_command_takes_every_engine_option(path: tuple[str, ...]) -> None:
    params = _params(path)
    for name in FIELDS:
        assert name in params, f"mlx {' '.join(path)} lacks --{name.replace('_', '-')}"
        default = next(f.default for f in dataclasses.fields(EngineOptions) if f.name == name)
        assert params[name].default == default
    # Only Claude Code asks the auto-mode check: the others take the flag without showing it.
    assert params["safeguards"].hidden == (path[-1] in ("codex", "opencode"))


def test_the_parsed_options_arrive_as_one_record() -> None:
    seen: list[EngineOptions] = []

    @takes_engine_options()
    def command(before: int = 0, engine: EngineOptions = EngineOptions(), after: int = 0) -> None:  # noqa: B008
        seen.append(engine)

    probe = typer.Typer()
    probe.command()(command)
    result = typer.testing.CliRunner().invoke(
        probe, ["--render", "exact", "--cache-dir", "/tmp/c", "--keep-alive", "5m"]
    )
    assert result.exit_code == 0, result.output
    assert seen == [EngineOptions(render="exact", cache_dir=Path("/tmp/c"), keep_alive="5m")]


def test_the_rank_spec_carries_the_options_typed() -> None:
    options = EngineOptions(cache_dir=Path("/tmp/x"), render="exact", speculate="off")
    spec = RankSpec.decoded(RankSpec(model="m", parallel="tensor", engine=options).encoded())
    assert spec.engine == options
    assert isinstance(spec.engine.cache_dir, Path)


def test_both_commands_serve_through_the_one_call() -> None:
    """`mlx serve` and `mlx launch` choose between here and a cluster nowhere but in
    launch/served.py: neither imports the two lifetimes it chooses between."""
    import ast

    launch = Path(__file__).resolve().parent.parent / "mlxlaunch" / "launch"
    for name in ("serve.py", "session.py"):
        tree = ast.parse((launch / name).read_text())
        imported = {
            f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        assert "mlxlaunch.launch.served.served" in imported, name
        assert "mlxlaunch.launch.serving.serving" not in imported, name
        assert "mlxlaunch.launch.cluster_serve.cluster_serving" not in imported, name
