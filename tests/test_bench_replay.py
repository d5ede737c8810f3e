"""The replay workload: a recorded Claude Code or Codex session sent request by request as the
agent sent it, on our real server (over the agent's own API) and mlx_lm.server (mapped to
chat completions), with per-turn reuse, the server's account of each miss, and the answers'
tool calls judged. Checks what is sent and reported; never a time."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import serve
from transcript_files import claude_session, write_jsonl

from mlxlaunch.bench.clients import OpenAITarget, StreamTiming, on_anthropic_event, on_openai_event
from mlxlaunch.bench.codex_session import on_responses_event
from mlxlaunch.bench.ours import start_local_server
from mlxlaunch.bench.peer import PeerServer
from mlxlaunch.bench.progress import SilentProgress
from mlxlaunch.bench.replay import (
    ChatReplay,
    ReplayTarget,
    ServedReplay,
    call_problem,
    describe,
    measure_replay,
    measure_settings,
    miss_of,
    model_token_count,
    replay_settings,
    replay_turns,
    write_redacted,
)
from mlxlaunch.bench.summary import ROW_ORDER, replay_rows, workload_of
from mlxlaunch.cli.main import main
from mlxlaunch.launch.transcripts import read_transcript
from mlxlaunch.protocol.stats import StatsSnapshot

OURS, PEER = "mlxlaunch", "mlx_lm.server"
SESSIONS = Path(__file__).parent / "fixtures" / "transcripts"
CLAUDE = SESSIONS / "claude-code-2.1.332-session.jsonl"
CODEX = SESSIONS / "codex-0.171.0-rollout.jsonl"
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"},
               "limit": {"type": "integer"}}, "required": ["file_path"],
               "additionalProperties": False}  # fmt: skip


def test_turns_are_the_agents_bodies_streamed_with_the_output_capped() -> None:
    transcript = read_transcript(CLAUDE)
    turns = replay_turns(transcript, max_tokens=7)
    assert len(turns) == len(transcript.turns)
    for turn, recorded in zip(turns, transcript.turns, strict=True):
        assert turn.body == {**recorded.body, "stream": True, "max_tokens": 7}
        assert turn.api == "messages" and "Read" in turn.tools
        # The chat-completions copy: no system message after the first (folded into the user
        # turn before it), the same tools.
        assert turn.conversation.system.startswith("x-anthropic-billing-header") is False
        assert all(m.role != "system" for m in turn.conversation.messages)
        assert "# Environment" in turn.conversation.messages[0].content
        assert [t.name for t in turn.conversation.tools] == list(turn.tools)
    codex = replay_turns(read_transcript(CODEX), max_tokens=5)
    assert all(t.body["max_output_tokens"] == 5 and t.api == "responses" for t in codex)
    assert codex[1].recorded_calls == ("exec_command",)


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("Read", '{"file_path": "/a"}', None),
        ("Read", '{"file_path": "/a", "limit": 20}', None),
        ("Write", '{"file_path": "/a"}', "no tool named 'Write' was offered"),
        ("Read", '{"file_path": ', "arguments are not JSON"),
        ("Read", "[1]", "arguments are not a JSON object"),
        ("Read", "{}", "missing required file_path"),
        ("Read", '{"file_path": "/a", "mode": 1}', "unknown argument mode"),
        ("Read", '{"file_path": 3}', "file_path is not string"),
        ("Read", '{"file_path": "/a", "limit": "all"}', "limit is not integer"),
    ],
)
def test_a_call_is_valid_only_as_the_offered_tool_describes_it(
    name: str, arguments: str, problem: str | None
) -> None:
    assert call_problem(name, arguments, {"Read": READ_SCHEMA}) == problem


def test_each_stream_reader_collects_the_answers_calls_and_id() -> None:
    timing = StreamTiming()
    start = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}}
    events = [
        start,
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"file_path": '}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '"/a"}'}},
    ]  # fmt: skip
    for event in events:
        on_anthropic_event(event["type"], json.dumps(event), timing, 0.1)
    assert timing.response_id == "msg_1" and timing.calls == [["Read", '{"file_path": "/a"}']]

    timing = StreamTiming()
    named = {"index": 0, "function": {"name": "Read", "arguments": ""}}
    rest = {"index": 0, "function": {"arguments": '{"file_path":"/b"}'}}
    for delta in ({"tool_calls": [named]}, {"tool_calls": [rest]}):
        on_openai_event("", json.dumps({"choices": [{"delta": delta}]}), timing, 0.1)
    assert timing.calls == [["Read", '{"file_path":"/b"}']]

    timing = StreamTiming()
    created = {"type": "response.created", "response": {"id": "resp_1"}}
    done = {"type": "response.output_item.done", "item": {"type": "function_call",
            "name": "exec_command", "arguments": '{"cmd": "ls"}', "call_id": "c"}}  # fmt: skip
    for event in (created, done):
        on_responses_event(event["type"], json.dumps(event), timing, 0.1)
    assert timing.response_id == "resp_1" and timing.calls == [["exec_command", '{"cmd": "ls"}']]


def test_the_miss_is_the_servers_account_of_that_request_only() -> None:
    miss = {"request_id": "msg_2", "kind": "partial", "position": 300, "request_tokens": 900,
            "nearest_tokens": 800, "cached_tokens": 300}  # fmt: skip
    snapshot = StatsSnapshot.model_validate({"cache": {"last_miss": miss}})
    assert miss_of(snapshot, "msg_1") is None
    found = miss_of(snapshot, "msg_2")
    assert found is not None and (found["position"], found["kind"]) == (300, "partial")
    small = StatsSnapshot.model_validate({"models": [{"cache": {"last_miss": miss}}]})
    assert miss_of(small, "msg_2") == found


def _figures(ttft: float, prompt: int, cached: int | None, **extra: Any) -> dict[str, Any]:
    return {"ttft_s": ttft, "prompt_tokens": prompt, "cached_tokens": cached, "error": None,
            "decode_tokens_per_s": 50.0, "calls": [], "miss": None, **extra}  # fmt: skip


def test_rows_give_each_turn_its_reuse_miss_and_calls_beside_the_peer() -> None:
    miss = {"kind": "partial", "position": 1200, "request_tokens": 3000, "nearest_tokens": 2900}
    calls = [{"name": "Read", "problem": None}, {"name": "Bash", "problem": "missing command"}]
    replay = {
        "agent": "claude", "version": "2.1.332", "targets": [OURS, PEER],
        "turns": [
            {"turn": 1, "results": {OURS: _figures(1.0, 2000, 0), PEER: _figures(2.0, 2000, 0)}},
            {"turn": 2, "results": {OURS: _figures(0.2, 3000, 1200, miss=miss, calls=calls),
                                    PEER: _figures(0.5, 3000, None)}},
        ],
    }  # fmt: skip
    rows = replay_rows({"replay": replay})
    assert all(workload_of(r) == "replay" for r in rows) and "replay" in ROW_ORDER
    assert rows[0].workload == "replay (claude 2.1.332)"
    metrics = ["turn 1 TTFT", "turn 2 TTFT", "TTFT p50", "prompt tokens reused",
               "tool calls valid", "decode p50"]  # fmt: skip
    assert [r.metric for r in rows] == metrics
    second = rows[1].notes[OURS]
    assert (
        "1.2k/3.0k cached" in second
        and "missed at token 1.2k of 3.0k (nearest earlier prompt: 2.9k)" in second
    )
    assert "1/2 calls valid (missing command)" in second
    reused = rows[3].values
    assert reused[OURS] == pytest.approx(1200 / 5000) and reused[PEER] is None  # not reported
    assert rows[4].values == {OURS: 0.5, PEER: None} and rows[4].notes[PEER] == "no calls made"
    assert replay_rows({}) == [] and replay_rows({"replay": {}}) == []


# --- against real servers ----------------------------------------------------------------


async def _replay(targets: list[ReplayTarget], path: Path, max_tokens: int) -> dict[str, Any]:
    turns = replay_turns(read_transcript(path), max_tokens=max_tokens)
    try:
        return await measure_replay(
            targets, turns, max_tokens=max_tokens, progress=SilentProgress()
        )
    finally:
        for target in targets:
            await target.aclose()


@pytest.mark.slow
def test_replay_on_our_server_and_mlx_lm_server_explains_the_miss_after_a_compaction(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A Claude Code session compacted after its third tool round, replayed on our server
    and mlx_lm.server (tiny model): every turn answered on both; ours reads each turn's
    previous prompt from its cache until the compaction, and explains that turn's miss;
    then the Codex rollout fixture over /v1/responses."""
    records = claude_session("d00d0000-0000-4000-8000-000000000001", "/home/dev/app",
                             turns=6, tool_result_chars=800, compact_at=3)  # fmt: skip
    path = write_jsonl(tmp_path / "session.jsonl", records)

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        peer = PeerServer(tiny_model_dir)
        peer.start()
        local = await start_local_server(str(tiny_model_dir), cache_dir=tmp_path / "cache")
        try:
            await asyncio.to_thread(peer.wait_ready, 120)
            targets: list[ReplayTarget] = [
                ServedReplay(OURS, local.url, auth_token=local.auth_token),
                ChatReplay(OpenAITarget(PEER, peer.url)),
            ]
            claude = await _replay(targets, path, 4)
            codex = await _replay(
                [ServedReplay(OURS, local.url, auth_token=local.auth_token)], CODEX, 4
            )
            return claude, codex
        finally:
            local.stop()
            peer.stop()

    claude, codex = asyncio.run(run())
    ours = [t["results"][OURS] for t in claude["turns"]]
    peer = [t["results"][PEER] for t in claude["turns"]]
    print("ours (prompt, cached, miss):",
          [(t["prompt_tokens"], t["cached_tokens"], t["miss"]) for t in ours])  # fmt: skip
    assert len(ours) == 6 and all(t["error"] is None and t["ttft_s"] is not None for t in ours)
    assert all(t["error"] is None and t["prompt_tokens"] for t in peer)
    assert ours[0]["prompt_tokens"] > 10_000  # Claude Code's system prompt and tools
    for before, after in itertools.pairwise(ours[:3]):
        assert after["cached_tokens"] >= 0.98 * before["prompt_tokens"]
        assert after["miss"] is None
    compacted = ours[3]
    assert compacted["prompt_tokens"] < ours[2]["prompt_tokens"]  # the summary replaced turns
    miss = compacted["miss"]
    assert miss is not None, compacted
    # Reuse stopped where the summary begins: after the system prompt and tools, before the
    # end of the earlier prompt; the cached count is what the server reports as reused.
    assert 10_000 < miss["position"] < miss["nearest_tokens"]
    assert abs(compacted["cached_tokens"] - miss["cached_tokens"]) <= 64
    rows = replay_rows({"replay": {**describe(read_transcript(path)), **claude}})
    assert "missed at token" in rows[3].notes[OURS]
    assert rows[0].values[PEER] is not None

    turns = [t["results"][OURS] for t in codex["turns"]]
    assert all(t["error"] is None for t in turns)
    for before, after in itertools.pairwise(turns):
        assert after["cached_tokens"] >= 0.98 * before["prompt_tokens"]


@pytest.mark.slow
def test_the_answers_tool_calls_are_judged_on_a_scripted_model(tiny_model_dir: Path) -> None:
    """The model writes a valid Read call on turn 1 and a Read without its file_path on turn
    2: the replay says so (the Messages stream as Claude Code reads it)."""
    token = secrets.token_hex(8)
    with serve(tiny_model_dir, token=token) as served:
        call = '{"name": "Read", "arguments": {"file_path": "/home/dev/shop/cart.py"}}'
        served.scripted.enqueue(f"<tool_call>\n{call}\n</tool_call>")
        served.scripted.enqueue('<tool_call>\n{"name": "Read", "arguments": {}}\n</tool_call>')
        target = ServedReplay(OURS, served.server.url, auth_token=token)
        turns = replay_turns(read_transcript(CLAUDE), max_tokens=64)[:2]

        async def run() -> dict[str, Any]:
            try:
                return await measure_replay([target], turns, max_tokens=64,
                                            progress=SilentProgress())  # fmt: skip
            finally:
                await target.aclose()

        figures = asyncio.run(run())
    calls = [t["results"][OURS]["calls"] for t in figures["turns"]]
    print("calls:", calls)
    assert calls[0] == [{"name": "Read", "problem": None}]
    assert calls[1] and calls[1][0]["name"] == "Read"
    assert calls[1][0]["problem"] == "missing required file_path"


@pytest.mark.slow
def test_redaction_with_the_models_tokenizer_keeps_each_texts_token_count(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    count = model_token_count(str(tiny_model_dir))
    for path in (CLAUDE, CODEX):
        transcript = read_transcript(path)
        redacted, inexact = write_redacted(transcript, count, tmp_path / path.name)
        assert inexact == 0
        assert len(redacted.turns) == len(transcript.turns)
        assert "coupon" not in (tmp_path / path.name).read_text()


def _bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()", "bench",
               *args]  # fmt: skip
    env = {**os.environ, "COLUMNS": "220"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_redact_without_a_replay_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--model", "tiny", "--redact", "--out", str(tmp_path)]) == 2
    assert "--redact and --redact-out need --replay PATH" in "".join(capsys.readouterr())
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_mlx_bench_replay_redacted_prints_the_turns_and_writes_them(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`mlx bench --quick --replay FIXTURE --redact --redact-out FILE` with the other
    workloads off but the agent session: the table has the replay's turns beside
    mlx_lm.server, the JSON its figures, FILE the redacted session (which replays the same)."""
    out, redacted = tmp_path / "results", tmp_path / "shared.jsonl"
    done = _bench("--quick", "--model", "tiny", "--out", str(out), "--no-speculative",
                  "--no-restart", "--no-tool-loop", "--no-codex-session", "--concurrency", "1",
                  "--replay", str(CODEX), "--redact", "--redact-out", str(redacted),
                  "--replay-kv-bits", "8")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"redacted session: {redacted}" in done.stdout
    assert "replaying 5 turns of codex session" in done.stdout and "tools" in done.stdout
    assert "replay (codex 0.171.0)" in done.stdout and "turn 5 TTFT" in done.stdout
    assert "TTFT p50, --kv-bits 8" in done.stdout
    assert "coupon" not in redacted.read_text()
    assert len(read_transcript(redacted).turns) == 5
    [json_path] = out.glob("*.json")
    replay = json.loads(json_path.read_text())["workloads"]["replay"]
    assert replay["file"] == "shared.jsonl" and replay["agent"] == "codex"
    assert [t["turn"] for t in replay["turns"]] == [1, 2, 3, 4, 5]
    assert [s["setting"] for s in replay["settings"]] == ["--kv-bits 8"]
    for turn in replay["turns"]:
        assert turn["results"].keys() == {OURS, PEER}
        assert all(r["error"] is None for r in turn["results"].values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replay-kv-bits", "8"], "--replay-kv-bits and --replay-speculate need --replay PATH"),
        (["--replay", str(CODEX), "--replay-kv-bits", "6"], "--replay-kv-bits takes 8 or 4"),
        (["--replay", str(CODEX), "--replay-speculate", "draft"],
         "--replay-speculate takes auto, lookup, off"),
    ],
)  # fmt: skip
def test_replay_settings_are_checked_before_anything_starts(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--model", "tiny", "--out", str(tmp_path), *args]) == 2
    assert message in " ".join("".join(capsys.readouterr()).split())


def test_each_setting_is_one_flag_with_the_others_at_their_defaults() -> None:
    settings = replay_settings((8, 4), ("off",))
    assert [(s.label, s.options) for s in settings] == [
        ("--kv-bits 8", {"kv_bits": 8}), ("--kv-bits 4", {"kv_bits": 4}),
        ("--speculate off", {"speculate": "off"}),
    ]  # fmt: skip
    assert replay_settings((), ()) == []


@pytest.mark.slow
def test_the_replay_runs_again_under_each_setting_on_a_server_of_its_own(
    tiny_model_dir: Path,
) -> None:
    """--replay-kv-bits 8 and --replay-speculate off: the Codex rollout replayed on a server
    started with each; both reuse each turn's previous prompt, and each has its rows."""
    turns = replay_turns(read_transcript(CODEX), max_tokens=4)
    settings = replay_settings((8,), ("off",))
    measured = asyncio.run(
        measure_settings(
            str(tiny_model_dir), turns, settings, max_tokens=4, progress=SilentProgress()
        )
    )
    assert [m["setting"] for m in measured] == ["--kv-bits 8", "--speculate off"]
    for setting in measured:
        sent = [t["results"][OURS] for t in setting["turns"]]
        assert all(t["error"] is None for t in sent)
        for before, after in itertools.pairwise(sent):
            assert after["cached_tokens"] >= 0.95 * before["prompt_tokens"]
    replay = {"agent": "codex", "version": "0.171.0", "targets": [OURS],
              "turns": measured[0]["turns"], "settings": measured}  # fmt: skip
    metrics = [r.metric for r in replay_rows({"replay": replay})]
    assert "TTFT p50, --kv-bits 8" in metrics and "prompt tokens reused, --speculate off" in metrics
