"""The product's npm install of the pinned Claude Code, for real, where it costs nothing.

It runs only where the shared test install (tests/e2e/claude_cli.py: `claude_cache_dir()`)
already holds the pinned release: npm then finds everything in place and in its cache
(`--prefer-offline`), so nothing is downloaded and no network is needed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from e2e.claude_cli import CLAUDE_CODE_VERSION, claude_cache_dir

from mlxlaunch.launch.claude_bin import claude_version, find_claude, pinned_claude
from mlxlaunch.launch.claude_install import install_claude_code

pytestmark = pytest.mark.e2e


def test_npm_installs_the_pinned_release_where_the_launcher_looks(tmp_path: Path) -> None:
    prefix = claude_cache_dir()
    installed = claude_version(pinned_claude(prefix)) or ""
    if shutil.which("npm") is None or not installed.startswith(CLAUDE_CODE_VERSION):
        pytest.skip("the shared test install of Claude Code is not there: it would download")
    binary = install_claude_code(prefix, timeout=120)
    assert binary == pinned_claude(prefix)
    assert (claude_version(binary) or "").startswith(CLAUDE_CODE_VERSION)
    # With no claude on PATH, the launcher finds exactly this one.
    assert find_claude(None, path=str(tmp_path), prefix=prefix) == binary
