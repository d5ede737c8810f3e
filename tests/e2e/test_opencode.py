"""End to end: the real opencode (pinned) through `mlx launch opencode` on a scripted test model.

`mlx launch opencode --model M -- run "write the proof file"` with no other flag: the
launcher's `OPENCODE_CONFIG_CONTENT` points opencode at `/v1/chat/completions`, and the scripted
model calls opencode's own `bash` tool, which writes the file; the request that carries the
tool output back gets the final answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from e2e.launching import launch_argv, launch_env, run_launch
from scripted_mlx import scripted_mlx_command, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHAT_LINE = re.compile(r"mlxlaunch\.server: chatcmpl-?\w+ .*status=200")


def test_opencode_run_runs_a_bash_tool_round_trip(
    tmp_path: Path, real_opencode: Path, small_model_dir: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "user").mkdir()
    call = {
        "name": "bash",
        "arguments": {"command": "echo opencode-proof > proof.txt", "description": "Write it"},
    }
    tool_turn = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    final = "The proof file is written."
    # opencode also asks for a session title (a request without tools), at a moment of its
    # own: that request gets its reply apart, whichever comes first.
    script = write_script(
        tmp_path / "script.json", [tool_turn] + [final] * 4, untooled=["Proof file"]
    )
    words = ["run", "write the proof file"]
    mlx = scripted_mlx_command(script)
    argv = launch_argv(mlx, "opencode", small_model_dir, real_opencode, words)
    done, log = run_launch(argv, work, launch_env(tmp_path), timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert (work / "proof.txt").read_text().strip() == "opencode-proof", (
        done.stdout + done.stderr + log
    )
    assert final in done.stdout + done.stderr
    assert len(CHAT_LINE.findall(log)) >= 2, log  # the tool output came back
