"""Claude Code for tests: the real CLI (pinned, installed with npm) and a scripted stand-in.

The stand-in is a small Python program put where `claude` would be. It writes what it saw (argv,
environment, process group) to `$FAKE_CLAUDE_REPORT` and then acts out its first argument:

    exit N        exit with status N
    wait-signal   report "ready", then exit 40 + the number of the first signal received
                  (all signals that arrived are in the report)
    request       POST one message to $ANTHROPIC_BASE_URL with the bearer token, report the answer
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlxlaunch.launch.claude_bin import CLAUDE_CODE_VERSION, pinned_claude
from mlxlaunch.launch.claude_install import install_claude_code

__all__ = ["CLAUDE_CODE_VERSION", "claude_cache_dir", "install_real_claude", "write_fake_claude"]

FAKE_CLAUDE = r"""
import json, os, signal, sys, time, urllib.request

report_path = os.environ["FAKE_CLAUDE_REPORT"]
report = {"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid(),
          "pgid": os.getpgrp(), "ready": False, "foreground": None}
if os.isatty(0):
    report["foreground"] = os.tcgetpgrp(0) == os.getpgrp()

def write():
    with open(report_path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(report_path + ".tmp", report_path)

if sys.argv[1:2] == ["--version"]:
    print("9.9.9 (Fake Claude)")
    sys.exit(0)
action = sys.argv[1] if len(sys.argv) > 1 else "exit"
if action == "exit":
    write()
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
if action == "wait-signal":
    got = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH):
        signal.signal(sig, lambda n, f: got.append(n))
    report["ready"] = True
    write()
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # catch a second copy of the same signal, if one comes
    report["signals"] = got
    write()
    sys.exit(40 + got[0] if got else 1)
if action == "request":
    base = os.environ["ANTHROPIC_BASE_URL"]
    body = json.dumps({"model": os.environ["ANTHROPIC_MODEL"], "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(base + "/v1/messages", data=body, method="POST", headers={
        "content-type": "application/json", "anthropic-version": "2023-06-01",
        "authorization": "Bearer " + os.environ["ANTHROPIC_AUTH_TOKEN"]})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            report["status"] = resp.status
            report["body"] = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        report["status"] = err.code
        report["body"] = err.read().decode()
    write()
    sys.exit(0 if report["status"] == 200 else 7)
sys.exit(99)
"""


def write_fake_claude(directory: Path) -> Path:
    """Write the stand-in as `directory/claude` (executable) and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "claude"
    path.write_text(f"#!{sys.executable}\n{FAKE_CLAUDE}")
    path.chmod(0o755)
    return path


def install_real_claude(prefix: Path) -> Path | None:
    """The pinned Claude Code under `prefix`, installed there by the product's own installer
    (npm) if it is not yet; None when npm is missing."""
    binary = pinned_claude(prefix)
    if binary.exists() and _version_ok(binary):
        return binary
    if shutil.which("npm") is None:
        return None
    return install_claude_code(prefix, timeout=600)


def _version_ok(binary: Path) -> bool:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.startswith(CLAUDE_CODE_VERSION)


def claude_cache_dir() -> Path:
    """Where tests keep the npm install, shared across runs (override: MLXLAUNCH_TEST_NPM_DIR)."""
    override = os.environ.get("MLXLAUNCH_TEST_NPM_DIR")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "mlxlaunch-tests" / "npm"
