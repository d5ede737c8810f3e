"""End to end: the real Claude Code CLI (pinned), interactive on a pseudo-terminal in auto mode,
gets its safety check's verdict from our server (server/safeguards.py).

In auto mode Claude Code sends `safeguards` with each request and waits for
`safeguard_results`; without them, the first command that needs the check opens the "Auto
mode can't check actions in this session" dialog. Here the model's replies are scripted at
the model boundary (tests/scripted_mlx.py explains how): the tool turn, then the check's
verdict — the classifier request runs on the same engine, held to its schema — then the
reply to the tool result. Everything between, Claude Code's TUI included, runs for real.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import re
import select
import signal
import struct
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import serve

from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "local-test-token"
COMMAND = "python3 -c 'print(6*7)' > out.txt"  # runs code: auto mode asks for the check
CALL = json.dumps({"name": "Bash", "arguments": {"command": COMMAND, "description": "Run it"}})
TOOL_TURN = f"</think>\n\n<tool_call>\n{CALL}\n</tool_call>"
FINAL = "Finished-7731"
NO_CHECK = "can'tcheckactions"  # the dialog's title, spaces removed (the TUI moves the cursor)
ANSI = re.compile(
    rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]"  # CSI: cursor moves, colours
    rb"|\x1b\][^\x07\x1b]*(\x07|\x1b\\)"  # OSC: titles, links
    rb"|\x1b[=>()][0-9A-B]?"
)


@pytest.fixture  # one per test: each starts with an empty script queue
def served(small_model_dir: Path) -> Iterator[tuple[ServerHandle, ScriptedOutput]]:
    # The test model is far under the size the check needs by default: judge anyway.
    settings = {"safeguards_min_parameters": 0}
    with serve(small_model_dir, token=TOKEN, settings=settings) as server:
        yield server.server, server.scripted


def verdict(outcome: str, explanation: str) -> str:
    return json.dumps({"1": {"explanation": explanation, "outcome": outcome}})


def run_on_pty(
    claude: Path, tmp_path: Path, base_url: str, prompt: str, *, until: str, timeout: float = 150
) -> str:
    """Claude Code interactive in auto mode on a pseudo-terminal, given `prompt` at start;
    returns the screen's text (escapes stripped) once `until` shows or `timeout` passes."""
    work, home = tmp_path / "work", tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    # A user past onboarding who trusts the folder: no first-run dialogs in the way.
    settings = {
        "hasCompletedOnboarding": True,
        "theme": "dark",
        "numStartups": 1,
        "projects": {str(work): {"hasTrustDialogAccepted": True, "allowedTools": []}},
    }
    (home / ".claude" / ".claude.json").write_text(json.dumps(settings))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "TERM": "xterm-256color",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": TOKEN,
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": "local-model",
        "ANTHROPIC_SMALL_FAST_MODEL": "local-model",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "local-model",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    argv = [str(claude), prompt, "--permission-mode", "auto"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: Claude Code on the terminal's far side
        os.chdir(work)
        os.execve(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break
            if until in squeeze(screen):
                time.sleep(1.0)  # let the dialog, if any, draw too
                break
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    return ANSI.sub(b"", screen).decode("utf-8", errors="replace")


def squeeze(screen: bytes | str) -> str:
    """The screen's text without escapes or whitespace (the TUI positions words by cursor)."""
    raw = screen if isinstance(screen, bytes) else screen.encode()
    return re.sub(r"\s+", "", ANSI.sub(b"", raw).decode("utf-8", errors="replace"))


@pytest.mark.parametrize(
    ("judged", "runs"),
    [
        (("not_flagged", "The user asked to run this script."), True),
        (("flagged", "Runs code the user did not ask for."), False),
    ],
    ids=["allowed-runs-without-the-cant-check-dialog", "flagged-is-blocked"],
)
def test_the_servers_verdict_decides_and_no_cant_check_dialog_shows(
    tmp_path: Path,
    real_claude: Path,
    served: tuple[ServerHandle, ScriptedOutput],
    caplog: pytest.LogCaptureFixture,
    judged: tuple[str, str],
    runs: bool,
) -> None:
    """Claude Code in auto mode runs the script's command; the server's safety check says
    `judged` (outcome, explanation)."""
    server, scripted = served
    scripted.enqueue(text=TOOL_TURN)
    scripted.enqueue(text=verdict(*judged))
    for _ in range(3):
        scripted.enqueue(text=f"</think>\n\n{FINAL}")
    with caplog.at_level(logging.INFO, logger="mlxlaunch.server"):
        screen = run_on_pty(real_claude, tmp_path, server.url, "run the script", until=FINAL)
    checks = [r.getMessage() for r in caplog.records if "safety check:" in r.getMessage()]
    out = tmp_path / "work" / "out.txt"
    if runs:
        assert out.read_text().strip() == "42", screen[-3000:]
        assert "auto mode on" in screen
    else:
        assert not out.exists(), screen[-3000:]
    assert NO_CHECK not in squeeze(screen), screen[-3000:]
    assert checks and f"calls=1 flagged={int(not runs)}" in checks[0], checks
