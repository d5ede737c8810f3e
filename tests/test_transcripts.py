"""Agents' transcripts read back into the requests they sent: Claude Code's project JSONL and
Codex's rollouts, in their real formats (fixtures/transcripts/, tests/transcript_files.py),
and their redaction to same-token-count filler."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from transcript_files import claude_session, codex_rollout, write_jsonl

from mlxlaunch.bench.replay import generation_request
from mlxlaunch.launch.transcripts import TranscriptError, read_transcript
from mlxlaunch.launch.transcripts.records import RESUME_PLACEHOLDER
from mlxlaunch.launch.transcripts.redact import REDACTED_CWD, redact
from mlxlaunch.launch.transcripts.redact import write_jsonl as as_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
SESSIONS = FIXTURES / "transcripts"
CLAUDE = SESSIONS / "claude-code-2.1.332-session.jsonl"
CODEX = SESSIONS / "codex-0.171.0-rollout.jsonl"
PACKAGED = Path(__file__).parent.parent / "mlxlaunch" / "launch" / "transcripts" / "data"


def _texts(blocks: list[dict[str, Any]]) -> list[str]:
    return [b.get("text") or str(b.get("content") or b.get("input")) for b in blocks]


def test_packaged_captures_are_the_fixtures() -> None:
    pairs = {
        "claude_code_2.1.332_request.json": "claude-code-2.1.332/tool-result-request.json",
        "codex_0.171.0_request.json": "codex-0.171.0/responses-request-0.json",
    }
    for packaged, fixture in pairs.items():
        assert (PACKAGED / packaged).read_bytes() == (FIXTURES / fixture).read_bytes()


def test_claude_transcript_gives_each_request_of_the_main_conversation() -> None:
    transcript = read_transcript(CLAUDE)
    assert (transcript.agent, transcript.version, transcript.cwd) == ("claude", "2.1.332",
                                                                      "/home/dev/shop")  # fmt: skip
    assert transcript.session_id == "5b0c1d2e-3f40-4a51-8b62-7c83d94ea5f6"
    # Five answers on the kept branch: the rewound one, the subagent's and the synthetic API
    # error are not the conversation; the line cut short at the end is skipped.
    assert [t.answered_tools for t in transcript.turns] == [("Read", "Bash"), (), ("Edit",),
                                                            ("Bash",), ()]  # fmt: skip
    bodies = [t.body for t in transcript.turns]
    first = bodies[0]["messages"]
    # The captured request's context before the user's words, then its environment turn,
    # with this session's working directory.
    assert first[0]["role"] == "user" and "Attribution" in first[0]["content"][0]["text"]
    assert first[0]["content"][-1]["text"].startswith("The cart total is wrong")
    assert first[1]["role"] == "system" and "/home/dev/shop" in first[1]["content"]
    assert "/home/dev/project" not in json.dumps(bodies)
    # The answer written as four records (thinking, text, two calls) is one turn; the
    # parallel calls' results, siblings in the file, are one user turn.
    second = bodies[1]["messages"]
    assert [b["type"] for b in second[2]["content"]] == ["thinking", "text", "tool_use",
                                                        "tool_use"]  # fmt: skip
    assert [b["tool_use_id"] for b in second[3]["content"]] == ["toolu_01", "toolu_02"]
    everything = json.dumps(bodies)
    for left_out in ("rewrite the whole module", "API Error", "Search for coupon handling",
                     "toolUseResult", "Auto-accept"):  # fmt: skip
        assert left_out not in everything
    # Each request resends the one before it, as Claude Code does.
    for before, after in itertools.pairwise(bodies):
        assert after["messages"][: len(before["messages"])] == before["messages"]
        assert after["system"] == before["system"] and after["tools"] == before["tools"]
    assert "session_id" in bodies[0]["metadata"]["user_id"]
    assert transcript.session_id in bodies[0]["metadata"]["user_id"]
    resume = transcript.resume_body["messages"]
    assert resume[:-1] == bodies[-1]["messages"] + [resume[-2]]  # the last answer, then
    assert resume[-1] == {"role": "user", "content": [{"type": "text",
                                                       "text": RESUME_PLACEHOLDER}]}  # fmt: skip
    assert "system prompt" in transcript.filled and "tools" in transcript.filled


def test_codex_rollout_gives_each_request() -> None:
    transcript = read_transcript(CODEX)
    assert (transcript.agent, transcript.version) == ("codex", "0.171.0")
    assert [t.answered_tools for t in transcript.turns] == [("exec_command",),
        ("exec_command",), (), ("exec_command",), ()]  # fmt: skip
    inputs = [t.body["input"] for t in transcript.turns]
    assert [i.get("role") for i in inputs[0]] == ["developer", "developer", "user", "user"]
    assert [i["type"] for i in inputs[1][4:]] == ["reasoning", "function_call",
                                                  "function_call_output"]  # fmt: skip
    for before, after in itertools.pairwise(inputs):
        assert after[: len(before)] == before
    body = transcript.turns[0].body
    captured = json.loads((FIXTURES / "codex-0.171.0/responses-request-0.json").read_text())
    assert body["tools"] == captured["tools"] and body["prompt_cache_key"] == transcript.session_id
    assert "instructions" not in body  # the developer messages carry them, as Codex sends
    assert transcript.resume_body["input"][:-1] == inputs[-1] + [
        transcript.resume_body["input"][-2]
    ]
    assert transcript.resume_body["input"][-1]["content"][0]["text"] == RESUME_PLACEHOLDER


def test_every_rebuilt_request_is_one_our_server_accepts() -> None:
    for path in (CLAUDE, CODEX):
        transcript = read_transcript(path)
        for turn in [*transcript.turns]:
            generation = generation_request(turn.body, turn.api)
            assert generation.kind == "main" and generation.tools
        generation_request(transcript.resume_body, transcript.api)


def test_a_compaction_starts_the_conversation_again_from_its_summary(tmp_path: Path) -> None:
    records = claude_session("c0ffee00-0000-4000-8000-000000000000", "/w", turns=6,
                             compact_at=3)  # fmt: skip
    transcript = read_transcript(write_jsonl(tmp_path / "s.jsonl", records))
    assert len(transcript.turns) == 6
    lengths = [len(t.body["messages"]) for t in transcript.turns]
    # Turns 1–3 before the compaction grow; turn 4 starts again from the summary.
    assert lengths[:3] == sorted(lengths[:3]) and lengths[3] < lengths[2]
    after = transcript.turns[3].body["messages"]
    assert "continued from a previous conversation" in after[0]["content"][-1]["text"]
    assert "continued from a previous" in json.dumps(transcript.resume_body)
    assert "Step 1" not in json.dumps(transcript.resume_body)  # what the summary replaced


def test_codex_compaction_replaces_the_history(tmp_path: Path) -> None:
    records = codex_rollout("019a0000-0000-7000-8000-000000000001", "/w", turns=3)
    summary = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "Summary so far."}]}  # fmt: skip
    records.append({"timestamp": "t", "type": "compacted",
                    "payload": {"message": "", "replacement_history": [summary]}})  # fmt: skip
    transcript = read_transcript(write_jsonl(tmp_path / "rollout-x.jsonl", records))
    assert transcript.resume_body["input"][0] == summary


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "neither a Claude Code transcript nor a Codex rollout"),
        ('{"type": "summary", "summary": "x", "leafUuid": "u"}\n', "neither"),
        ('{"type":"session_meta","payload":{"id":"s"}}\n', "no user message"),
        ('{"type":"user","uuid":"u","sessionId":"s","isSidechain":true,'
         '"message":{"role":"user","content":"hi"}}\n', "no user or assistant messages"),
    ],
)  # fmt: skip
def test_a_file_with_no_conversation_says_so(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    with pytest.raises(TranscriptError, match=problem) as caught:
        read_transcript(path)
    assert caught.value.path == path


def test_a_missing_file_or_a_directory_is_a_transcript_error(tmp_path: Path) -> None:
    with pytest.raises(TranscriptError, match=r"s\.jsonl"):
        read_transcript(tmp_path / "s.jsonl")
    with pytest.raises(TranscriptError, match="directory"):
        read_transcript(tmp_path)


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("path", [CLAUDE, CODEX], ids=["claude", "codex"])
def test_redaction_keeps_structure_and_token_counts_and_drops_every_text(
    path: Path, tmp_path: Path
) -> None:
    transcript = read_transcript(path)
    records, redactor = redact(transcript, _words)
    out = tmp_path / path.name
    out.write_text(as_jsonl(records))
    redacted = read_transcript(out)
    assert redactor.inexact == 0
    assert [t.answered_tools for t in redacted.turns] == [
        t.answered_tools for t in transcript.turns
    ]
    assert redacted.session_id == transcript.session_id and redacted.cwd == REDACTED_CWD
    text = out.read_text()
    for secret in ("coupon", "cart", "pytest", "shop", "toolUseResult", "Wall time"):
        assert secret not in text, secret
    # Same number of messages per request, and every redacted text the same word count.
    for before, after in zip(transcript.turns, redacted.turns, strict=True):
        key = "messages" if transcript.agent == "claude" else "input"
        assert len(before.body[key]) == len(after.body[key])
    originals = [t for t in redactor.seen if t.strip()]
    assert originals and all(_words(redactor.seen[t]) == _words(t) for t in originals)
    # Equal texts, equal filler: a repeat stays a repeat.
    assert redactor.text(originals[0]) == redactor.seen[originals[0]]
