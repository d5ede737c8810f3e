"""End to end: the real Codex CLI (pinned) through `mlx launch codex` on a scripted test model.

`mlx launch codex --model M -- exec "write the proof file"` with no other flag: the launcher's
per-launch CODEX_HOME points Codex at `/v1/responses`, and the scripted model calls Codex's
own shell tool (`exec_command` with `{"cmd": …}`, as in tests/fixtures/codex-0.171.0), which
writes the file; the second request carries the tool output back and gets the final answer.
Codex asks for reasoning summaries, so the test model thinks: each reply closes its span.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from e2e.launching import git_work, launch_argv, launch_env, run_launch
from scripted_mlx import scripted_mlx_command, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RESPONSE_LINE = re.compile(
    r"mlxlaunch\.server: resp_\w+ .* prompt=(\d+) cached=(\d+) .* status=200"
)


def test_codex_exec_runs_a_shell_tool_round_trip(
    tmp_path: Path, real_codex: Path, small_model_dir: Path
) -> None:
    work = git_work(tmp_path)
    call = {"name": "exec_command", "arguments": {"cmd": "echo codex-proof > proof.txt"}}
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    final = "The proof file is written."
    script = write_script(tmp_path / "script.json", [tool_turn] + [f"</think>\n\n{final}"] * 3)
    words = ["exec", "write the proof file"]
    mlx = scripted_mlx_command(script)
    argv = launch_argv(mlx, "codex", small_model_dir, real_codex, words)
    done, log = run_launch(argv, work, launch_env(tmp_path), timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert (work / "proof.txt").read_text().strip() == "codex-proof", done.stderr + log
    assert final in done.stdout + done.stderr
    served = [(int(p), int(c)) for p, c in RESPONSE_LINE.findall(log)]
    assert len(served) >= 2 and served[1][0] > served[0][0], log  # the tool output came back
    # Nothing of the launch is left behind: the per-launch CODEX_HOME is gone.
    assert not list((tmp_path / "mlx" / "agents" / "codex").glob("launch-*"))
    assert not (tmp_path / "user" / ".codex").exists()  # the user's own Codex home untouched


def test_codex_sessions_rollout_reads_back_and_its_resume_is_warm(
    tmp_path: Path, real_codex: Path, small_model_dir: Path
) -> None:
    """Issue 36 on the real CLI: the rollout Codex writes (kept in mlxlaunch's home across
    launches) reads back into what it sent, and `mlx launch codex -- exec resume --last`
    prefills that session while Codex starts."""
    from mlxlaunch.launch.transcripts import read_transcript

    work = git_work(tmp_path)
    env = launch_env(tmp_path)
    call = {"name": "exec_command", "arguments": {"cmd": "echo resumed > r.txt"}}
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    script = write_script(tmp_path / "one.json", [tool_turn] + ["</think>\n\nWritten."] * 3)
    argv = launch_argv(scripted_mlx_command(script), "codex", small_model_dir, real_codex,
                       ["exec", "write r.txt"])  # fmt: skip
    done, _ = run_launch(argv, work, env, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    [rollout] = (tmp_path / "mlx" / "agents" / "codex" / "sessions").glob("*/*/*/rollout-*.jsonl")
    transcript = read_transcript(rollout)
    assert transcript.agent == "codex" and len(transcript.turns) >= 2
    assert "echo resumed > r.txt" in json.dumps(transcript.resume_body)

    for old in (tmp_path / "mlx" / "logs").glob("launch-*.log"):
        old.unlink()  # this launch's log alone
    script = write_script(tmp_path / "two.json", ["</think>\n\nDone."] * 3)
    argv = launch_argv(scripted_mlx_command(script), "codex", small_model_dir, real_codex,
                       ["exec", "resume", "--last", "say done"])  # fmt: skip
    done, log = run_launch(argv, work, env, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert re.search(rf"warm resume of {transcript.session_id}: \d+ prompt tokens ready", log), log
