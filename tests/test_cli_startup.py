"""`mlx` starts fast: a command imports only its own code, and the shell completion's query
imports neither the CLI nor the hub client.

Checked as the modules a process imports (`python -X importtime`, one line per module), not
as times: which modules load does not depend on how busy the machine is. Measured before
this was so (2 cores): `mlx --help` 0.9-1.5 s, each TAB on a model name 0.85-1.7 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from local_store import write_store

from mlxlaunch.cli.commands import COMMANDS
from mlxlaunch.cli.main import main
from mlxlaunch.console import MODEL_NAMES_QUERY
from mlxlaunch.store import list_models

pytestmark = pytest.mark.quick  # each starts a process; all take well under a second

# What no command needs to be listed or to show its help.
HEAVY = ("textual", "huggingface_hub", "httpx", "httpx2", "pydantic", "mlx", "mlx_lm", "numpy")
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def imported_by(argv: list[str], env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules `mlx ARGV` imports (through the console script's entry), and its stdout."""
    code = f"import sys; sys.argv = ['mlx', *{argv!r}]; from mlxlaunch.console import run; run()"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (_IMPORTED.match(line) for line in done.stderr.splitlines())
    return {m.group(1) for m in lines if m}, done.stdout


def _tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_command_module() -> None:
    modules, out = imported_by(["--help"])
    assert "Commands:" in out and all(c.name in out for c in COMMANDS)
    commands = {f"mlxlaunch.cli.{c.module}" for c in COMMANDS}
    assert not modules & commands, sorted(modules & commands)
    assert not _tops(modules) & set(HEAVY), sorted(_tops(modules) & set(HEAVY))
    rooms = {m.split(".")[1] for m in modules if m.startswith("mlxlaunch.") and "." in m[10:]}
    assert rooms <= {"cli"}, sorted(m for m in modules if m.startswith("mlxlaunch."))


@pytest.mark.parametrize("command", ["models", "launch", "serve", "config", "ps"])
def test_a_commands_help_imports_its_own_module_only(command: str) -> None:
    modules, _ = imported_by([command, "--help"])
    mine = {c.module for c in COMMANDS if c.name == command}
    others = {f"mlxlaunch.cli.{c.module}" for c in COMMANDS if c.module not in mine}
    assert not modules & others, sorted(modules & others)
    for heavy in ("textual", "huggingface_hub", "mlx", "mlxlaunch.bench", "mlxlaunch.dash.app"):
        assert heavy not in modules, heavy


def test_completing_a_model_name_imports_neither_the_cli_nor_the_hub_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = tmp_path / "hub"
    write_store(hub)
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "MLXLAUNCH_HOME": str(tmp_path / "home")}
    modules, fast = imported_by(list(MODEL_NAMES_QUERY), env)
    for library in ("typer", "click", "rich", "huggingface_hub", "pydantic", "mlx"):
        assert library not in _tops(modules), library
    # The same names, in the same order, as the command itself prints through the CLI.
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    assert main(list(MODEL_NAMES_QUERY)) == 0
    assert fast == capsys.readouterr().out
    assert fast.split() == [m.name for m in list_models()]
    assert fast.split() == ["qwen-coder-7b", "qwen3-4b", "test-org/Llama-Finetune-bf16"]


def test_the_names_are_those_of_the_full_listing_whatever_the_store_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from local_store import quantized_files, write_hub_repo

    from mlxlaunch.store import register_local
    from mlxlaunch.store.inventory import local_model_names

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    write_store(hub)
    write_hub_repo(hub, "someone/just-a-tokenizer", {"tokenizer.json": b"{}"})  # not a model
    unpinned = write_hub_repo(hub, "someone/No-Main", quantized_files(10_000_000, 4, 8192))
    (unpinned.parents[1] / "refs" / "main").unlink()  # no `main` ref: the newest snapshot
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text('{"model_type": "qwen3"}')
    register_local("Mine", own)
    register_local("gone", tmp_path / "moved-away")  # registered, then its folder went
    names = local_model_names()
    assert names == [m.name for m in list_models()]
    assert "someone/No-Main" in names and "Mine" in names
    assert "someone/just-a-tokenizer" not in names and "gone" not in names


def test_every_name_of_the_store_package_resolves_to_its_object() -> None:
    import importlib
    import types

    import mlxlaunch.store as store

    pull_module = importlib.import_module("mlxlaunch.store.pull")
    for name in store.__all__:
        assert not isinstance(getattr(store, name), types.ModuleType), name
    assert store.pull is pull_module.pull  # the function, though a submodule shares its name
