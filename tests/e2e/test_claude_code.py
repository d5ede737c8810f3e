"""End to end: the real Claude Code CLI (pinned) against `mlx launch claude` and a test model.

The model has random weights, so its replies are scripted at the model boundary: `mlx` runs
through tests/scripted_mlx.py, which hands the launcher a scripted logits hook. Tokens are
forced, while the tokenizer, template, output parsers, server and Claude Code itself all run
for real. The test model
thinks by default (Claude Code asks for adaptive thinking), so each reply first closes its
thinking span.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from e2e.launching import MLX, launch_argv, launch_env, run_launch
from scripted_mlx import scripted_mlx_command, write_script

from mlxlaunch.testing.demo import DEMO_FILE_TEXT

# The demo's greeting is one of the quick tier's smoke tests (tests/tiers.py): one real Claude
# Code round trip through `mlx launch claude`, where npm can install it. The rest: `slow`.
pytestmark = pytest.mark.e2e

REQUEST_LINE = re.compile(r"mlxlaunch\.server: msg_\w+ .* status=200")


def _launch(
    tmp_path: Path,
    claude: Path,
    model: Path | str,
    outputs: list[str] | None,
    claude_args: list[str],
    *options: str,
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`mlx launch claude --model MODEL OPTIONS -- CLAUDE_ARGS` in a fresh work directory;
    `outputs` are the scripted replies (None: the model's own, e.g. the demo's)."""
    work = tmp_path / "work"
    work.mkdir()
    mlx = MLX
    if outputs is not None:
        mlx = scripted_mlx_command(write_script(tmp_path / "script.json", outputs))
    done, log = run_launch(
        launch_argv(
            mlx,
            "claude",
            model,
            claude,
            claude_args,
            *(["--env", "CLAUDE_CODE_MAX_OUTPUT_TOKENS=64"] if outputs is not None else []),
            *options,
        ),
        work,
        launch_env(tmp_path),
        timeout=240,
    )
    assert log, done.stderr
    return done, log


@pytest.mark.slow
def test_print_mode_answer_comes_from_our_server(
    tmp_path: Path, real_claude: Path, small_model_dir: Path
) -> None:
    reply = "Hello from the local model."
    done, log = _launch(
        tmp_path, real_claude, small_model_dir, [f"</think>\n\n{reply}"] * 3, ["-p", "hello"]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert reply in done.stdout
    assert REQUEST_LINE.search(log), log


@pytest.mark.slow
def test_tool_call_runs_and_its_result_goes_back(
    tmp_path: Path, real_claude: Path, small_model_dir: Path
) -> None:
    call = {
        "name": "Bash",
        "arguments": {"command": "echo made-by-tool > made.txt", "description": "Write a file"},
    }
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    final = "The file is written."
    done, log = _launch(
        tmp_path,
        real_claude,
        small_model_dir,
        [tool_turn] + [f"</think>\n\n{final}"] * 2,
        ["-p", "write the file", "--allowedTools", "Bash"],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "work" / "made.txt").read_text().strip() == "made-by-tool"
    # Claude Code asks again only to hand back the tool result; the reply to that is printed.
    assert final in done.stdout
    served = [
        (int(p), int(c))
        for p, c in re.findall(r"msg_\w+ .* prompt=(\d+) cached=(\d+) .* status=200", log)
    ]
    prompts = [p for p, _ in served]
    assert len(prompts) >= 2 and prompts[1] > prompts[0], log  # the tool turn came back
    # The turn carrying the tool result prefilled only what was new: everything the first turn
    # sent came from the prefix cache (the cache keeps whole 256-token blocks, at worst one less).
    assert served[1][1] >= prompts[0] - 256, log


@pytest.mark.quick  # the smoke test
def test_the_demo_greets_and_says_what_it_is(tmp_path: Path, real_claude: Path) -> None:
    # The README's first command: the demo answers Claude Code with its own short message.
    done, log = _launch(tmp_path, real_claude, "demo", None, ["-p", "explain this repo"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo model" in done.stdout and "mlx models" in done.stdout
    assert REQUEST_LINE.search(log), log


@pytest.mark.slow
def test_the_demo_runs_a_real_tool_round_trip(tmp_path: Path, real_claude: Path) -> None:
    done, _ = _launch(
        tmp_path,
        real_claude,
        "demo",
        None,
        ["-p", "create a file hello.txt", "--allowedTools", "Bash"],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = tmp_path / "work" / "hello.txt"
    assert written.read_text().strip() == DEMO_FILE_TEXT
    assert "full tool round trip" in done.stdout


@pytest.mark.slow
def test_the_haiku_tier_is_served_by_the_small_model(
    tmp_path: Path, real_claude: Path, small_model_dir: Path, tiny_model_dir: Path
) -> None:
    """`mlx launch claude --small-model tiny`: Claude Code's own `--model haiku` names the tier
    the launcher set (ANTHROPIC_DEFAULT_HAIKU_MODEL), and the small model answers it."""
    reply = "Hello from the small model."
    done, log = _launch(
        tmp_path,
        real_claude,
        small_model_dir,
        [f"</think>\n\n{reply}"] * 3,
        ["-p", "hello", "--model", "haiku"],
        "--small-model",
        str(tiny_model_dir),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert reply in done.stdout
    served = re.findall(r"msg_\w+ model=(\S+) .* status=200 served=(\S+)", log)
    assert served and all(by == tiny_model_dir.name for _, by in served), log


@pytest.mark.slow
def test_a_real_sessions_transcript_reads_back_and_its_resume_is_warm(
    tmp_path: Path, real_claude: Path, small_model_dir: Path
) -> None:
    """Issue 36 on the real CLI: the transcript Claude Code itself writes reads back into the
    conversation it sent, and `mlx launch claude -- --resume ID` prefills it while Claude Code
    starts, so the first resumed turn reuses the recorded session from the prefix cache."""
    from mlxlaunch.launch.transcripts import read_transcript

    call = {"name": "Bash", "arguments": {"command": "echo hi > hi.txt", "description": "Write"}}
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    done, _ = _launch(
        tmp_path,
        real_claude,
        small_model_dir,
        [tool_turn] + ["</think>\n\nWritten."] * 2,
        ["-p", "write hi.txt", "--allowedTools", "Bash"],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = [p for p in (tmp_path / "user" / ".claude" / "projects").glob("*/*.jsonl")]
    transcript = read_transcript(path)
    assert transcript.session_id == path.stem and len(transcript.turns) >= 2
    sent = json.dumps(transcript.resume_body["messages"])
    assert "write hi.txt" in sent and "echo hi > hi.txt" in sent  # the call and its result

    env = launch_env(tmp_path)
    mlx = scripted_mlx_command(write_script(tmp_path / "again.json", ["</think>\n\nDone."] * 3))
    argv = launch_argv(mlx, "claude", small_model_dir, real_claude,
                       ["--resume", transcript.session_id, "-p", "say done"],
                       "--env", "CLAUDE_CODE_MAX_OUTPUT_TOKENS=64")  # fmt: skip
    for old in (tmp_path / "mlx" / "logs").glob("launch-*.log"):
        old.unlink()  # this launch's log alone
    done, log = run_launch(argv, tmp_path / "work", env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    warmed = re.search(rf"warm resume of {transcript.session_id}: (\d+) prompt tokens ready", log)
    assert warmed, log
    lines = re.findall(
        r"msg_\w+ model=\S+ prompt=(\d+) cached=(\d+) output=(\d+) .* status=200", log
    )
    warm_up = (warmed.group(1), "1")  # its prompt, one output token
    turns = [(int(p), int(c)) for p, c, out in lines if (p, out) != warm_up]
    # Claude Code's first resumed turn has the largest prompt (its title request, if any, has
    # no tools): it reuses the recorded session the warm-up prefilled.
    prompt, cached = max(turns)
    print(f"resumed turn: {cached}/{prompt} tokens cached, warm-up {warmed.group(1)} tokens")
    assert cached >= 0.9 * prompt, log
