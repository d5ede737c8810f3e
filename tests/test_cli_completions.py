"""Shell completion, exercised in the shells: the generated scripts are sourced and asked to
complete, with `mlx` itself run for the local model names (against a fixed hub cache).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from local_store import write_store

from mlxlaunch.cli.command_tree import command_tree
from mlxlaunch.cli.commands import root_command
from mlxlaunch.cli.completions import render_all
from mlxlaunch.cli.options import known_model_names
from mlxlaunch.store import CATALOG

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "completions"
# `mlx` in the shells below: this checkout's CLI, whatever is installed on PATH.
MLX = f"{shlex.quote(sys.executable)} -m mlxlaunch"
LOCAL = ["qwen-coder-7b", "qwen3-4b", "test-org/Llama-Finetune-bf16"]  # local_store's models


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a machine with local_store's three models downloaded."""
    root = tmp_path_factory.mktemp("completion-store")
    write_store(root / "hub")
    return {**os.environ, "HF_HUB_CACHE": str(root / "hub"), "MLXLAUNCH_HOME": str(root / "home")}


def _bash(words: list[str], env: dict[str, str]) -> list[str]:
    """What bash completes for the command line `words` (the last one being completed)."""
    script = (
        f'source {SCRIPTS / "mlx.bash"}; mlx() {{ {MLX} "$@"; }}; '
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _mlx; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


@pytest.mark.slow
def test_model_option_completes_test_catalog_and_local_models(store: dict[str, str]) -> None:
    names = _bash(["mlx", "serve", "--model", ""], store)
    assert {"demo", "tiny", *(e.alias for e in CATALOG), *LOCAL} <= set(names)
    assert _bash(["mlx", "launch", "claude", "-m", "qwen3-4"], store) == ["qwen3-4b"]
    assert _bash(["mlx", "bench", "--model", "=", "te"], store) == ["test-org/Llama-Finetune-bf16"]


@pytest.mark.quick
def test_options_complete_after_an_option_value(store: dict[str, str]) -> None:
    assert _bash(["mlx", "serve", "--model", "demo", "--po"], store) == ["--port"]
    assert _bash(["mlx", "serve", "-m", "demo", "--port", "8080", "--no-a"], store) == ["--no-auth"]
    # `--debug` is accepted after the command, so it completes there too.
    assert _bash(["mlx", "models", "list", "--de"], store) == ["--debug"]


@pytest.mark.slow
def test_model_arguments_complete_names_and_commands_still_complete(
    store: dict[str, str],
) -> None:
    assert set(LOCAL) <= set(_bash(["mlx", "models", "info", ""], store))
    assert _bash(["mlx", "models", "rm", "qwen-c"], store)[-1] == "qwen-coder-7b"
    assert _bash(["mlx", "models", "info", "demo", ""], store) == []  # it takes one name
    assert _bash(["mlx", "mod"], store) == ["models"]
    assert _bash(["mlx", "--debug", "models", "re"], store) == ["recommend"]
    # After `--` the words belong to claude: mlx completes nothing of its own there.
    assert _bash(["mlx", "launch", "claude", "--", "--po"], store) == []


@pytest.mark.quick
@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_completes_values_and_options(store: dict[str, str]) -> None:
    # The completion builtins are stand-ins that print what they were asked to offer.
    stubs = (
        'compadd() { [[ $1 == -- ]] && shift; print -r -- "names: $*" }; '
        '_describe() { print -r -- "$1: ${(P)2}" }; _files() { print files }; '
        "_message() { print message }; compset() { PREFIX=${PREFIX#*=} }; "
        f'mlx() {{ {MLX} "$@" }}; '
        't() { words=("$@"); CURRENT=${#words}; PREFIX=${words[CURRENT]}; _mlx }; '
    )
    cases = "t mlx serve --model demo --po; t mlx serve --model ''; t mlx serve --cache-dir ''"
    script = f"source {SCRIPTS / '_mlx'} >/dev/null 2>&1; {stubs}{cases}"
    proc = subprocess.run(["zsh", "-fc", script], capture_output=True, text=True, env=store)
    options, names, files = proc.stdout.splitlines()
    assert options.startswith("option:") and "--port:" in options
    assert names.startswith("names: ") and {"demo", *LOCAL} <= set(names.split())
    assert files == "files"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script_completes_values_and_options(store: dict[str, str]) -> None:
    def complete(line: str) -> list[str]:
        script = (
            f"source {SCRIPTS / 'mlx.fish'}; function mlx; {MLX} $argv; end; complete -C{line!r}"
        )
        proc = subprocess.run(["fish", "-c", script], capture_output=True, text=True, env=store)
        return [row.split("\t")[0] for row in proc.stdout.splitlines()]

    assert complete("mlx serve --model demo --po") == ["--port"]
    assert {"demo", *LOCAL} <= set(complete("mlx serve --model "))
    assert set(LOCAL) <= set(complete("mlx models info "))
    assert complete("mlx models re") == ["recommend"]


def test_value_kinds_are_read_from_the_commands() -> None:
    """Fails loudly if typer changes how a parameter's type is described (command_tree.py)."""
    nodes = {" ".join(n.path): n for n in command_tree(root_command()).walk()}
    serve = nodes["serve"]
    assert {"--model", "-m", "--draft-model", "--small-model"} == set(serve.flags_taking("model"))
    assert "--cache-dir" in serve.flags_taking("path")
    assert "--port" in serve.flags_taking("text")
    flags = [o.flags for o in serve.options if o.value is None]
    assert ("--preload", "--no-preload") in flags
    assert nodes["models info"].argument == "model"
    assert nodes["models add"].argument == "path"
    assert any(c.path == ("completions",) for c in nodes[""].children)  # no longer hidden


def test_scripts_carry_the_names_known_without_a_download() -> None:
    for text in render_all(command_tree(root_command())).values():
        for name in known_model_names():
            assert name in text
        assert "mlx models list --names" in text
