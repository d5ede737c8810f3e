"""How big a benchmark run is: turns, tokens, repetitions, concurrency levels."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class BenchConfig:
    """The sizes of every workload.

    Args:
        quick: shortened Claude Code prompt and small sizes (under a minute with a tiny model).
        turns: requests in the agent session (turn 1 plus one per tool round trip).
        tool_result_chars: characters of each tool result appended per turn.
        turn_max_tokens: tokens generated per agent/new-session turn (TTFT is what counts).
        warm_sessions: fresh sessions started after the agent session (warm new-session TTFT).
        decode_tokens: tokens per single-stream decode run.
        decode_runs: single-stream decode runs per server.
        concurrency: numbers of simultaneous streams.
        concurrency_rounds: times each concurrency level runs on each server, the server that
            goes first alternating, so one stalled round shows instead of averaging away.
        concurrency_tokens: tokens each concurrent stream generates.
        concurrency_prompt_tokens: prompt size of each concurrent stream (about; every stream
            has a prompt of its own, so nothing is shared between them).
        restart: after the other workloads, restart each server as a new process (ours on the
            same cache directory) and time a new session's first turn.
        restart_wait_s: how long after starting the new process the request is sent (a user
            typing), or when it is ready if that takes longer.
        tool_loop: last, on a test model with Qwen3's chat template, a session of tool loops
            with thinking, each ended by a new user prompt (`bench.tool_loop`).
        codex_session: after the Claude Code workloads, on the same servers and model, Codex
            CLI's captured requests grown by a function call and its output per turn, over
            `/v1/responses` (`bench.codex_session`); `turns` turns.
        replay_kv_bits: with a replay (`--replay`), replay it again on a server of ours
            started with each of these `--kv-bits` (after the other workloads, alone).
        replay_speculate: the same for each of these `--speculate` modes.
        speculative: our server with `--speculate auto` beside `--speculate off`, on a copy
            workload (the `copy` test model rewriting a file) and on the decode prompt of the
            run's own model (`bench.speculative`).
        speculative_streams: simultaneous streams of the speculative workloads.
        speculative_rounds: rounds of each speculative workload and stream count.
        speculative_file_words: words of the file the copy workload rewrites.
        speculative_edit_every: every n-th word of that file is changed (an edit to copy around).
        speculative_tokens: tokens each stream of the copy workload writes (the no-copy
            workload writes `decode_tokens`).
        haiku_rounds: rounds of the haiku-tier workload (`mlx bench --small-model`), each a
            main turn alone and one beside the side streams (`bench.haiku_tier`).
        haiku_side_streams: side requests (session titles) running at once beside the main turn.
        haiku_side_tokens: tokens each side request writes.
    """

    quick: bool = False
    turns: int = 6
    tool_result_chars: int = 3_000
    turn_max_tokens: int = 16
    warm_sessions: int = 2
    decode_tokens: int = 128
    decode_runs: int = 3
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    concurrency_tokens: int = 48
    concurrency_prompt_tokens: int = 2_000
    concurrency_rounds: int = 3
    restart: bool = True
    restart_wait_s: float = 3.0
    tool_loop: bool = True
    codex_session: bool = True
    replay_kv_bits: tuple[int, ...] = ()
    replay_speculate: tuple[str, ...] = ()
    speculative: bool = True
    speculative_streams: tuple[int, ...] = (1, 4)
    speculative_rounds: int = 3
    speculative_file_words: int = 400
    speculative_edit_every: int = 20
    speculative_tokens: int = 256
    haiku_rounds: int = 3
    haiku_side_streams: int = 4
    haiku_side_tokens: int = 24

    @classmethod
    def create(cls, *, quick: bool = False, **overrides: Any) -> BenchConfig:
        """Defaults for a full or a `--quick` run, with `overrides` (None values ignored)."""
        base = cls.quick_defaults() if quick else cls()
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def quick_defaults(cls) -> BenchConfig:
        """Every workload, both servers, small sizes."""
        return cls(
            quick=True,
            turns=3,
            tool_result_chars=1_500,
            turn_max_tokens=4,
            warm_sessions=1,
            decode_tokens=32,
            decode_runs=1,
            concurrency=(1, 2, 4, 8),
            concurrency_tokens=12,
            concurrency_prompt_tokens=500,
            # Short rounds: three of them cost a few seconds and show a stall as a full run does.
            concurrency_rounds=3,
            speculative_rounds=2,
            speculative_file_words=120,
            speculative_tokens=48,
            haiku_rounds=2,
            haiku_side_tokens=12,
        )

    def __post_init__(self) -> None:
        repeats = (self.turns, self.decode_runs, self.warm_sessions, self.concurrency_rounds,
                   self.speculative_rounds, self.haiku_rounds, self.haiku_side_streams)  # fmt: skip
        if min(repeats) < 1:
            raise ValueError(
                "turns, decode_runs, warm_sessions, the rounds and the side streams must be at "
                "least 1"
            )
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency levels must be positive")
        if not self.speculative_streams or min(self.speculative_streams) < 1:
            raise ValueError("speculative stream counts must be positive")
        if self.speculative_file_words < 1 or self.speculative_edit_every < 0:
            raise ValueError("the copy workload's file needs words (and edits every n ≥ 0)")
        counts = (self.turn_max_tokens, self.decode_tokens, self.concurrency_tokens,
                  self.speculative_tokens, self.haiku_side_tokens)  # fmt: skip
        if min(*counts, self.concurrency_prompt_tokens) < 1:
            raise ValueError("token counts must be at least 1")
        if self.restart_wait_s < 0:
            raise ValueError("restart_wait_s must not be negative")

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report."""
        data = asdict(self)
        data["concurrency"] = list(self.concurrency)
        data["speculative_streams"] = list(self.speculative_streams)
        data["replay_kv_bits"] = list(self.replay_kv_bits)
        data["replay_speculate"] = list(self.replay_speculate)
        return data
