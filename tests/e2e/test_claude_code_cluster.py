"""End to end: the real Claude Code CLI against `mlx launch claude --hosts …` on two ranks.

Two local processes on MLX's ring backend (127.0.0.1 twice) serve the tiny MoE test model
with tensor parallelism; rank 0's replies are scripted (tests/scripted_mlx.py runs every rank,
rank 0 with the script), so Claude Code's tool round trip is exact while the forward passes,
the lockstep between the ranks, the prefix cache on both and the server all run for real.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from e2e.claude_cli import CLAUDE_CODE_VERSION, claude_cache_dir, install_real_claude
from scripted_mlx import scripted_mlx_command, write_script

from mlxlaunch.testing import ensure_test_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOSTS = "127.0.0.1,127.0.0.1"


@pytest.fixture(scope="module")
def real_claude() -> Path:
    binary = install_real_claude(claude_cache_dir())
    if binary is None:
        pytest.skip(f"npm is not installed: cannot install Claude Code {CLAUDE_CODE_VERSION}")
    return binary


def rank_processes(marker: str) -> list[str]:
    listing = subprocess.run(
        ["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in listing.splitlines() if marker in line and not line.startswith("Z")]


def test_tool_round_trip_on_two_ranks(tmp_path: Path, real_claude: Path) -> None:
    ensure_test_model("tiny-moe")
    call = {
        "name": "Bash",
        "arguments": {"command": "echo made-on-a-cluster > made.txt", "description": "Write"},
    }
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    final = "The cluster wrote the file."
    script = write_script(tmp_path / "script.json", [tool_turn] + [f"</think>\n\n{final}"] * 2)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(tmp_path / "user"),
        CLAUDE_CONFIG_DIR=str(tmp_path / "user" / ".claude"),
        MLXLAUNCH_HOME=str(tmp_path / "mlx"),
        MLXLAUNCH_CONFIG_DIR=str(tmp_path / "mlx-config"),
    )
    done = subprocess.run(
        [
            *scripted_mlx_command(script),
            "launch",
            "claude",
            "--model",
            "tiny-moe",
            "--hosts",
            HOSTS,
            "--claude-bin",
            str(real_claude),
            "--env",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS=64",
            "--",
            "-p",
            "write the file",
            "--allowedTools",
            "Bash",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    logs = list((tmp_path / "mlx" / "logs").glob("launch-*.log"))
    log = logs[0].read_text() if logs else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert (work / "made.txt").read_text().strip() == "made-on-a-cluster"
    assert final in done.stdout
    served = [
        (int(p), int(c))
        for p, c in re.findall(r"msg_\w+ .* prompt=(\d+) cached=(\d+) .* status=200", log)
    ]
    assert len(served) >= 2 and served[1][0] > served[0][0], log
    # The tool-result turn reused the first turn's prefix on both ranks (a rank that held less
    # would have lowered the agreed count).
    assert served[1][1] >= served[0][0] - 256, log
    assert rank_processes(str(script)) == [], "a rank outlived the launch"
