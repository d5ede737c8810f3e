"""End to end: the real Claude Code CLI against `mlx launch claude --hosts …` on two ranks.

Two local processes on MLX's ring backend (127.0.0.1 twice) serve the tiny MoE test model
with tensor parallelism; rank 0's replies are scripted (tests/scripted_mlx.py runs every rank,
rank 0 with the script), so Claude Code's tool round trip is exact while the forward passes,
the lockstep between the ranks, the prefix cache on both and the server all run for real.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from e2e.launching import launch_argv, launch_env, run_launch
from scripted_mlx import scripted_mlx_command, write_script

from mlxlaunch.testing import ensure_test_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOSTS = "127.0.0.1,127.0.0.1"


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
    done, log = run_launch(
        launch_argv(
            scripted_mlx_command(script),
            "claude",
            "tiny-moe",
            real_claude,
            ["-p", "write the file", "--allowedTools", "Bash"],
            *("--hosts", HOSTS, "--env", "CLAUDE_CODE_MAX_OUTPUT_TOKENS=64"),
        ),
        work,
        launch_env(tmp_path),
        timeout=300,
    )
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
