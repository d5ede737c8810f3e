"""Warm resume: `mlx launch claude -- --resume ID` (or `--continue`, or `codex resume …`) finds
that session's transcript under the agent's home and prefills its conversation while the agent
starts, so the first resumed turn reuses it; the transcripts are the agents' real formats
(tests/transcript_files.py) under a temporary HOME, the agent a stand-in that sends what
Claude Code 2.1.332 sends on resuming (built here from the captured request, not by the code
under test) and reads the server's own stats."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import serve
from rich.console import Console
from transcript_files import (
    claude_project_slug,
    claude_session,
    write_claude_session,
    write_codex_rollout,
)

from mlxlaunch.launch.integrations import CLAUDE
from mlxlaunch.launch.options import LaunchOptions
from mlxlaunch.launch.resume import ResumeWarmth, prefill, warm_request
from mlxlaunch.launch.session import launch_agent
from mlxlaunch.launch.transcripts import read_transcript
from mlxlaunch.launch.transcripts.locate import project_slug, resumed_session_file

CAPTURED = Path(__file__).parent / "fixtures" / "claude-code-2.1.332" / "tool-result-request.json"
SESSION = "7e57a11e-0000-4000-8000-000000000030"
OTHER = "7e57a11e-0000-4000-8000-000000000001"


def test_the_slug_is_claude_codes() -> None:
    assert project_slug(Path("/Users/me/my_app.v2")) == "-Users-me-my-app-v2"
    assert claude_project_slug("/Users/me/my_app.v2") == project_slug(Path("/Users/me/my_app.v2"))


def test_claude_arguments_name_the_session_they_resume(tmp_path: Path) -> None:
    cwd = Path("/home/dev/app")
    environ = {"HOME": str(tmp_path)}
    older = write_claude_session(tmp_path, str(cwd), OTHER, turns=2)
    newer = write_claude_session(tmp_path, str(cwd), SESSION, turns=2)
    os.utime(older, (1_000, 1_000))
    (newer.parent / "agent-1234abcd.jsonl").write_text(older.read_text())  # a subagent's

    def found(*args: str) -> Path | None:
        return resumed_session_file("claude", args, cwd, environ)

    assert found("--resume", OTHER) == older
    assert found("-r", OTHER) == older and found(f"--resume={OTHER}") == older
    assert found("--continue") == newer and found("-c", "--model", "x") == newer
    assert found("--resume") is None  # the picker: nothing to know yet
    assert found("--resume", "--model") is None
    assert found("--resume", "no-such-session") is None
    assert found("--resume", "../../etc/passwd") is None
    assert found("--print", "hello") is None and found() is None
    assert found("--", "--continue") is None  # after `--`: the prompt's words
    # Another project's session, named by id: found where Claude Code keeps it.
    elsewhere = write_claude_session(tmp_path, "/srv/other", "5e55" * 9, turns=2)
    assert found("--resume", "5e55" * 9) == elsewhere
    # CLAUDE_CONFIG_DIR moves the whole tree.
    moved = {"HOME": str(tmp_path / "nowhere"), "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude")}
    assert resumed_session_file("claude", ["--continue"], cwd, moved) == newer
    assert resumed_session_file("opencode", ["--continue"], cwd, environ) is None


def test_codex_arguments_name_the_rollout_they_resume(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path)}
    here, there = Path("/home/dev/app"), "/srv/other"
    mine = write_codex_rollout(tmp_path, "019a0000-0000-7000-8000-00000000000a", str(here), turns=2)
    theirs = write_codex_rollout(tmp_path, "019a0000-0000-7000-8000-00000000000b", there, turns=2)
    os.utime(mine, (1_000, 1_000))

    def found(*args: str, cwd: Path = here) -> Path | None:
        return resumed_session_file("codex", args, cwd, environ)

    assert found("resume", "019a0000-0000-7000-8000-00000000000b") == theirs
    assert found("resume", "--last") == mine  # the newest of this directory, not of all
    assert found("exec", "resume", "--last", cwd=Path(there)) == theirs
    assert found("resume", "--last", cwd=Path("/elsewhere")) == theirs  # none here: newest
    assert found("resume") is None and found("exec", "hello") is None
    assert resumed_session_file("codex", ["resume", "--last"], here, {"HOME": "/none"}) is None
    assert (
        resumed_session_file(
            "codex", ["resume", "--last"], here, {"CODEX_HOME": str(tmp_path / ".codex")}
        )
        == mine
    )


def test_the_warm_request_is_the_resumed_conversation_with_one_output_token(tmp_path: Path) -> None:
    path = write_claude_session(tmp_path, "/home/dev/app", SESSION, turns=3)
    transcript = read_transcript(path)
    route, body, headers = warm_request(transcript)
    assert route == "/v1/messages" and body["max_tokens"] == 1 and body["stream"] is False
    assert body["messages"] == transcript.resume_body["messages"]
    assert headers["x-claude-code-session-id"] == SESSION
    rollout = write_codex_rollout(tmp_path, "019a0000-0000-7000-8000-00000000000c", "/w", turns=2)
    route, body, _ = warm_request(read_transcript(rollout))
    assert route == "/v1/responses" and body["max_output_tokens"] == 1 and body["store"] is False


# --- the agent's first resumed turn, through `mlx launch claude` -----------------------------


def claude_code_resumed_request(records: list[dict[str, Any]], cwd: str, words: str) -> dict:
    """What Claude Code 2.1.332 sends first on resuming the session of `records`: its system
    prompt, tools, context and environment turn (the captured request), the recorded
    messages (assistant records of one answer merged), and the user's new words."""
    body: dict[str, Any] = json.loads(CAPTURED.read_text().replace("/home/dev/project", cwd))[
        "body"
    ]
    context = body["messages"][0]["content"][:-1]
    environment = body["messages"][1]
    messages: list[dict[str, Any]] = []
    answer = None
    for record in records:
        if record.get("type") not in ("user", "assistant"):
            continue
        message = record["message"]
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        same = message.get("id") == answer if message["role"] == "assistant" else True
        if messages and messages[-1]["role"] == message["role"] and same:
            messages[-1]["content"] += copy.deepcopy(blocks)
        else:
            messages.append({"role": message["role"], "content": copy.deepcopy(blocks)})
        answer = message.get("id")
    messages[0]["content"] = [*context, *messages[0]["content"]]
    messages.insert(1, environment)
    messages.append({"role": "user", "content": [{"type": "text", "text": words}]})
    return {**body, "messages": messages, "max_tokens": 1, "stream": False}


# The stand-in agent: waits until the model is loaded (and, resuming, until one request — the
# warm-up — has finished: a user reading the resumed screen), sends its first turn, reports.
RESUMING_AGENT = r"""
import json, os, sys, time, urllib.request
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_AUTH_TOKEN"]
def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={
        "content-type": "application/json", "anthropic-version": "2023-06-01",
        "authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=600) as answer:
        return json.loads(answer.read())
resuming = any(a in ("--resume", "--continue") for a in sys.argv[1:])
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    stats = call("/v1/stats")
    if stats["model"]["state"] == "loaded" and (
            not resuming or stats["counters"]["requests_completed"] >= 1):
        break
    time.sleep(0.05)
body = json.load(open(os.environ["RESUMED_BODY"]))
start = time.perf_counter()
answer = call("/v1/messages", body)
seconds = time.perf_counter() - start
stats = call("/v1/stats")
with open(os.environ["AGENT_REPORT"], "w") as f:
    json.dump({"seconds": seconds, "usage": answer["usage"], "recent": stats["recent"]}, f)
"""


def _launch(tmp_path: Path, name: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
            cwd: Path, body: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Run `mlx launch claude --model tiny -- ARGS` with the stand-in, a fresh mlxlaunch home
    (no disk tier from another run) and HOME at `tmp_path`; the stand-in's report."""
    agent = tmp_path / f"{name}-claude"
    agent.write_text(f"#!{sys.executable}\n{RESUMING_AGENT}")
    agent.chmod(0o755)
    report, sent = tmp_path / f"{name}.json", tmp_path / f"{name}-body.json"
    sent.write_text(json.dumps(body))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / f"{name}-mlx"))
    monkeypatch.chdir(cwd)
    environ = {**os.environ, "HOME": str(tmp_path), "AGENT_REPORT": str(report),
               "RESUMED_BODY": str(sent)}  # fmt: skip
    options = LaunchOptions(model="tiny", agent_bin=str(agent), agent_args=args)
    code = launch_agent(CLAUDE, options, console=Console(file=None), environ=environ)
    assert code == 0
    result: dict[str, Any] = json.loads(report.read_text())
    return result


@pytest.mark.slow
def test_a_warm_resume_makes_the_first_turn_reuse_the_recorded_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    """A 30-turn Claude Code session resumed with `--resume ID`: the server's own stats say
    the agent's first turn read nearly all of its prompt from the cache; launched without
    resuming, the same turn reads next to nothing. Prints both turns' times."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    records = claude_session(SESSION, str(cwd), turns=30, tool_result_chars=600)
    write_claude_session(tmp_path, str(cwd), SESSION, turns=30, tool_result_chars=600)
    body = claude_code_resumed_request(records, str(cwd), "Now add a test for the fix.")

    warm = _launch(tmp_path, "warm", ("--resume", SESSION), monkeypatch, cwd, body)
    cold = _launch(tmp_path, "cold", (), monkeypatch, cwd, body)
    first_warm, first_cold = warm["recent"][-1], cold["recent"][-1]
    print(f"first resumed turn of 30: warm {warm['seconds']:.3f} s "
          f"({first_warm['cached_tokens']}/{first_warm['prompt_tokens']} cached), "
          f"cold {cold['seconds']:.3f} s "
          f"({first_cold['cached_tokens']}/{first_cold['prompt_tokens']} cached)")  # fmt: skip
    assert len(warm["recent"]) == 2  # the warm-up, then the agent's turn
    assert first_warm["prompt_tokens"] == first_cold["prompt_tokens"] > 15_000
    assert first_warm["cached_tokens"] >= 0.95 * first_warm["prompt_tokens"]
    assert warm["usage"]["cache_read_input_tokens"] == first_warm["cached_tokens"]
    assert first_cold["cached_tokens"] < 0.05 * first_cold["prompt_tokens"]


@pytest.mark.slow
def test_a_warm_codex_resume_is_reused_by_the_next_responses_turn(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The warm-up of a Codex rollout goes over /v1/responses as Codex sends it; the
    resumed turn (the recorded items and the user's new words) reads it back."""
    rollout = write_codex_rollout(tmp_path, "019a0000-0000-7000-8000-00000000000d", "/w",
                                  turns=8)  # fmt: skip
    warmth = ResumeWarmth(read_transcript(rollout))
    token = "resume-test"
    with serve(tiny_model_dir, token=token, scripted=False) as served:
        prefill(warmth, served.server.url, token)
        assert "error" not in warmth.outcome, warmth.outcome
        body = copy.deepcopy(warmth.transcript.resume_body)
        body["input"][-1]["content"][0]["text"] = "Now add a test for the fix."
        answer = served.post("/v1/responses", {**body, "stream": False, "max_output_tokens": 1})
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    print("warm-up:", warmth.outcome, "resumed turn:", usage)
    assert usage["input_tokens"] > 5_000
    assert usage["input_tokens_details"]["cached_tokens"] >= 0.95 * usage["input_tokens"]
