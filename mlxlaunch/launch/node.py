"""Node.js as the pinned Claude Code needs it: which `node` there is, and whether it is new enough.

`@anthropic-ai/claude-code@2.1.332` declares `"engines": {"node": ">=22.0.0"}`
(`npm view @anthropic-ai/claude-code@2.1.332 engines`). Node runs only npm and the package's
postinstall, which puts a native `claude` binary in place; an older node installs it anyway
after an EBADENGINE warning. A `claude` that is itself a node script (older releases, other
installers) runs under node, so there the version matters at every launch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NODE_REQUIRED = (22, 0, 0)
NODE_FIX = "install Node.js 22 or newer (it comes with npm): https://nodejs.org"

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")

NodeVersion = tuple[int, int, int]


def parse_node_version(text: str) -> NodeVersion | None:
    """`node --version`'s "v20.20.2" as (20, 20, 2); None when it is not a version."""
    match = _VERSION.search(text)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def format_version(version: NodeVersion) -> str:
    """(22, 0, 0) as "22.0.0"."""
    return ".".join(str(part) for part in version)


@dataclass(frozen=True)
class NodeFacts:
    """The `node` on PATH: where it is and its version (None: missing, or it did not answer)."""

    path: str | None
    version: NodeVersion | None

    @property
    def too_old(self) -> bool:
        """True when node answers with a version below what Claude Code declares."""
        return self.version is not None and self.version < NODE_REQUIRED


def node_facts(path: str | None = None, timeout: float = 10.0) -> NodeFacts:
    """Find `node` on `path` (default: $PATH) and ask it for its version."""
    found = shutil.which("node", path=path)
    if found is None:
        return NodeFacts(None, None)
    try:
        done = subprocess.run(
            [found, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return NodeFacts(found, None)
    return NodeFacts(found, parse_node_version(done.stdout) if done.returncode == 0 else None)


def node_problem(facts: NodeFacts) -> str | None:
    """What is wrong with node for Claude Code, in one line; None when nothing is."""
    wanted = f">= {format_version(NODE_REQUIRED)}"
    if facts.path is None:
        return f"Node.js is not on PATH (Claude Code needs node {wanted})"
    if facts.version is None:
        return f"{facts.path} does not answer --version (Claude Code needs node {wanted})"
    if facts.too_old:
        return f"node {format_version(facts.version)} is older than Claude Code's {wanted}"
    return None


def runs_under_node(binary: Path) -> bool:
    """True when `binary` is a script whose interpreter line names node (not a native build)."""
    try:
        with binary.open("rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"node" in first
