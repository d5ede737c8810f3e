"""Every command's `--help`: it has examples, and at 80 columns no option name or example line
is cut or broken (the tree is walked, so a new command is checked without editing this file).
"""

from __future__ import annotations

import re

import pytest
from text_snapshots import assert_fits, assert_whole

from mlxlaunch.cli.command_tree import CommandNode, command_tree
from mlxlaunch.cli.commands import root_command
from mlxlaunch.cli.main import main

TREE = command_tree(root_command())
NODES = {" ".join(node.path) or "(root)": node for node in TREE.walk()}


def _examples(node: CommandNode) -> list[str]:
    """The example command lines of a help text: the indented lines after `Examples:`."""
    _, _, after = node.full_help.partition("Examples:")
    return [line.strip() for line in after.splitlines() if line.startswith("  ")]


def _help(node: CommandNode, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*node.path, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(NODES))
def test_help_has_examples(name: str) -> None:
    node = NODES[name]
    assert "Examples" in node.full_help, f"`mlx {name} --help` needs an Examples: section"
    assert _examples(node), f"`mlx {name} --help` lists no example under Examples:"


def test_every_leaf_command_is_checked() -> None:
    leaves = [n for n in TREE.walk() if not n.children]
    assert len(leaves) >= 15
    assert {"models pull", "models recommend", "doctor", "serve", "launch claude"} <= set(NODES)


@pytest.mark.parametrize("name", sorted(NODES))
def test_help_at_80_columns_shows_every_option_and_example_whole(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    node = NODES[name]
    out = _help(node, capsys)
    assert_fits(out, 80)
    for flag in node.flag_names:
        if flag == "--debug" and node.path:
            continue  # a root option, accepted after any command (see cli/main.py)
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), f"{flag} missing"
    assert_whole(out, _examples(node))
    for child in node.children:
        assert re.search(rf"^\s+{re.escape(child.path[-1])}\s", out, re.M), child.path


def test_completions_is_listed_in_root_help(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(TREE, capsys)
    assert re.search(r"^\s+completions\s", out, re.M)


@pytest.mark.parametrize("group", ["", "models", "launch"])
def test_command_lists_show_each_summary_whole_at_80_columns(
    group: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    node = NODES[group or "(root)"]
    listing = _help(node, capsys).partition("Commands:")[2]
    cut = [line for line in listing.splitlines() if line.rstrip().endswith("...")]
    assert not cut, f"summaries cut short (give the command a short_help): {cut}"
