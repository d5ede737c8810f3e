"""`mlx doctor`'s claude and node checks: the pinned install is found, and fixes are pinned."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_doctor import HEALTHY

from mlxlaunch.launch.claude_bin import CLAUDE_CODE_VERSION, pinned_claude, pinned_prefix
from mlxlaunch.launch.doctor import Check, DoctorFacts, gather_facts, run_checks
from mlxlaunch.launch.node import NodeFacts

FACTS = replace(
    HEALTHY,
    system="Linux",
    machine="x86_64",
    device="cpu",
    models=(),
    claude_path="/home/u/.cache/mlxlaunch/claude-code/2.1.332/node_modules/.bin/claude",
    claude_install_dir="/home/u/.cache/mlxlaunch/claude-code/2.1.332",
    node=NodeFacts("/usr/bin/node", (22, 11, 0)),
)


def _check(facts: DoctorFacts, name: str) -> Check:
    return next(c for c in run_checks(facts) if c.name == name)


def test_missing_claude_fails_with_the_pinned_install_as_fix() -> None:
    check = _check(replace(FACTS, claude_path=None, claude_version=None), "claude")
    assert check.status == "fail"
    assert check.fix is not None
    assert "`mlx launch claude --install-claude`" in check.fix
    assert f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}" in check.fix
    assert FACTS.claude_install_dir in check.fix and "-g" not in check.fix.split()


def test_another_claude_version_is_named() -> None:
    assert _check(FACTS, "claude").status == "ok"
    other = _check(replace(FACTS, claude_version="2.2.0 (Claude Code)"), "claude")
    assert other.status == "ok" and f"tested with {CLAUDE_CODE_VERSION}" in other.detail
    silent = _check(replace(FACTS, claude_version=None), "claude")
    assert silent.status == "warn" and silent.fix is not None and "--install-claude" in silent.fix


@pytest.mark.parametrize(
    ("node", "claude_path", "needs_node", "status"),
    [
        (NodeFacts("/usr/bin/node", (22, 11, 0)), "/c", False, "ok"),
        (NodeFacts("/usr/bin/node", (20, 20, 2)), "/c", False, "warn"),  # installs anyway
        (NodeFacts("/usr/bin/node", (20, 20, 2)), "/c", True, "fail"),  # claude runs on it
        (NodeFacts(None, None), None, False, "fail"),  # nothing to install claude with
        (NodeFacts(None, None), "/c", False, "info"),  # the native claude needs no node
        (NodeFacts("/usr/bin/node", None), None, False, "warn"),
    ],
)
def test_node_check(
    node: NodeFacts, claude_path: str | None, needs_node: bool, status: str
) -> None:
    facts = replace(FACTS, node=node, claude_path=claude_path, claude_needs_node=needs_node)
    check = _check(facts, "node")
    assert check.status == status, check
    if status != "ok":
        assert check.fix is not None and "Node.js 22 or newer" in check.fix
    if node.version == (20, 20, 2):
        assert "20.20.2" in check.detail and ">= 22.0.0" in check.detail


def test_node_is_not_judged_when_not_looked_at() -> None:
    assert [c for c in run_checks(replace(FACTS, node=None)) if c.name == "node"] == []


def test_doctor_finds_the_pinned_install_when_claude_is_not_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    claude = pinned_claude()
    claude.parent.mkdir(parents=True)
    claude.write_text(f"#!/bin/sh\necho '{CLAUDE_CODE_VERSION} (Claude Code)'\n")
    claude.chmod(0o755)
    facts = gather_facts(models=lambda: ())
    assert facts.claude_path == str(claude)
    assert facts.claude_install_dir == str(pinned_prefix())
    assert facts.node == NodeFacts(None, None) and not facts.claude_needs_node
    check = _check(facts, "claude")
    assert check.status == "ok" and str(claude) in check.detail
