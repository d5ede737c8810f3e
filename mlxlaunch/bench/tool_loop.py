"""The tool-loop workload: new user prompts after loops of tool rounds, as Claude Code sends them.

One scripted session (`workloads.tool_loop_session`) on each server, alternating request by
request, on a test model of the workload's own with Qwen3's real chat template; per turn, the
time to first token and the prompt tokens the server reused.

Why Qwen3's template: it shows an assistant turn's thinking only after the last user prompt, so
a new prompt re-renders every earlier assistant turn without its thinking. A server that renders
each request afresh loses its cached prefix at the first assistant turn of the loop before; one
that keeps earlier turns as it first rendered them reuses the whole session. The new-prompt rows
show which a server does. (For the same reason there is no in-process floor here: the common
prefix of two renderings is what the template decides, not a limit.)

The servers are the workload's own, started once the other workloads' have stopped: ours in
this process on a fresh cache directory, mlx_lm.server as a child, both on the built model.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlxlaunch.bench.clients import AnthropicTarget, Target
from mlxlaunch.bench.ours import OURS_NAME, LocalServer, start_local_server
from mlxlaunch.bench.peer import PeerServer, ready_target
from mlxlaunch.bench.progress import ProgressSink
from mlxlaunch.bench.runner import alternate
from mlxlaunch.bench.workloads import LoopTurn, short_chat
from mlxlaunch.launch.models import build_real_template_model, test_model_sizes

# A copy of tests/fixtures/chat-templates/qwen3-0.6b.* ships as package data (the bench runs
# from an installed wheel, without the tests); a test keeps the copy equal to the fixture.
TEMPLATE_FAMILY = "qwen3-0.6b"
# A quick run stays about a minute on two cores: the smallest test model.
QUICK_SIZE = "tiny"
# A full run on a model that is not a test model: the size made for benchmarks.
FULL_SIZE = "large"


def tool_loop_size(model_name: str, *, quick: bool) -> str:
    """The test-model size the tool loop runs on: the smallest in a quick run; in a full one,
    the size being benchmarked when that is a test model, else `large`."""
    if quick:
        return QUICK_SIZE
    return model_name if model_name in test_model_sizes() else FULL_SIZE


def build_tool_loop_model(directory: Path, size: str) -> Path:
    """Build a random-weight test model of `size` with Qwen3's real chat template and tokens
    in `directory`; returns the model's directory."""
    return build_real_template_model(directory, size, TEMPLATE_FAMILY)


def tool_loop_steps(turns: Sequence[LoopTurn], targets: int) -> int:
    """Progress steps of the measuring phase: the warm-up and every turn, on every server."""
    return (1 + len(turns)) * targets


async def measure_tool_loop(
    targets: Sequence[Target],
    turns: Sequence[LoopTurn],
    *,
    max_tokens: int,
    progress: ProgressSink,
) -> dict[str, Any]:
    """Every turn on every target, alternating; raw figures by turn, then by target name."""

    async def send(conversation: Any, tokens: int, step: int) -> dict[str, Any]:
        async def run(target: Target) -> dict[str, Any]:
            timing = await target.measure(conversation, tokens)
            progress.advance()
            return timing.as_dict()

        return await alternate(targets, step, run)

    # First calls compile kernels: a short unrelated request keeps that out of the first turn.
    warmup = await send(short_chat(0), 2, 0)
    measured = []
    for number, turn in enumerate(turns, start=1):
        results = await send(turn.conversation, max_tokens, number)
        measured.append({"turn": number, "kind": turn.kind, "results": results})
    return {"targets": [t.name for t in targets], "warmup": warmup, "turns": measured}


async def run_tool_loop(
    turns: Sequence[LoopTurn],
    *,
    size: str,
    max_tokens: int,
    progress: ProgressSink,
    peer: bool = True,
    peer_timeout_s: float = 300.0,
    engine_options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Build the workload's model, start ours (and the peer, unless `peer` is False) on it,
    measure `turns`, stop both. Returns raw figures (with the model's description) and
    warnings (a peer that did not start is left out, not fatal)."""
    warnings: list[str] = []
    targets: list[Target] = []
    local: LocalServer | None = None
    other: PeerServer | None = None
    with tempfile.TemporaryDirectory(prefix="mlx-bench-tool-loop-") as tmp:
        progress.begin(f"tool loop: its model ({TEMPLATE_FAMILY} template, {size})", 1)
        model_dir = build_tool_loop_model(Path(tmp), size)
        try:
            if peer:
                other = PeerServer(model_dir)
                other.start()  # loads in its own process while ours loads here
            local = await start_local_server(
                str(model_dir), cache_dir=Path(tmp) / "cache", **(engine_options or {})
            )
            targets.append(AnthropicTarget(OURS_NAME, local.url, auth_token=local.auth_token))
            if other is not None:
                ready = await ready_target(other, peer_timeout_s, warnings, "tool loop")
                targets += [ready] if ready else []
            progress.advance()
            progress.begin("tool loop, alternating", tool_loop_steps(turns, len(targets)))
            figures = await measure_tool_loop(
                targets, turns, max_tokens=max_tokens, progress=progress
            )
        finally:
            for target in targets:
                await target.aclose()
            if local is not None:
                local.stop()
            if other is not None:
                other.stop()
    figures["model"] = {"template": TEMPLATE_FAMILY, "size": size}
    return figures, warnings
