"""Issue 22, item 5: the engine on several ranks answers exactly as on one process.

Several local processes started by `mlx.launch --backend ring` over 127.0.0.1 run the engine:
rank 0 leads (its worker shares each decision, engine/scheduling/lockstep.py), the others
follow (follower.py), the model loaded with mlx-lm's `sharded_load`. A growing conversation
(each turn reusing the last's cached prefix, as the ranks agree) and three requests batched
together must give the same greedy text, cached-token counts and lengths as one process.
Covered: the tiny qwen3_moe model (the Qwen3-30B-A3B architecture) with tensor parallelism on
2 ranks and pipeline parallelism on 3, and a dense qwen3 model with tensor parallelism
on 2 (mlx-lm's qwen3 has no pipeline support).
Every launch runs in its own process group, killed whole afterwards, and no rank may outlive
its test: SIGTERM to `mlx.launch` alone orphans the ranks.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxlaunch.testing import ensure_test_model

# The launcher mlx installs next to this interpreter (the venv's), else one on PATH.
_BESIDE = Path(sys.executable).with_name("mlx.launch")
MLX_LAUNCH = str(_BESIDE) if _BESIDE.is_file() else shutil.which("mlx.launch")

pytestmark = [
    pytest.mark.slow,  # every test here loads a model
    pytest.mark.xdist_group("cluster"),  # ranks of 2-3 processes each: one such test at a time
    pytest.mark.skipif(
        MLX_LAUNCH is None or not mx.distributed.is_available("ring"),
        reason="mlx.launch or MLX's ring backend is not available",
    ),
]

NEW_TOKENS = 12  # per request
LAUNCH_TIMEOUT_S = 120  # a run takes seconds; this only bounds a hang
TOKENS_MARKER = "TOKENS "

# One program for every rank and for the single-process reference. With a group of one it
# loads plainly, so the reference shares nothing with the sharded path but the decoding.
RANK_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import mlx.core as mx
    from mlxlaunch.engine.config import ClusterRole, EngineConfig
    from mlxlaunch.engine.engine import Engine
    from mlxlaunch.engine.runtime.rank_group import RankGroup
    from mlxlaunch.engine.scheduling.follower import Follower
    from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest, Sampling, TextDelta

    model_dir, parallel, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    group = mx.distributed.init()
    role = ClusterRole(RankGroup(group), parallel) if group.size() > 1 else None
    config = EngineConfig(model=model_dir, cluster=role, cache_dir=None, idle_clear_s=None)
    if role is not None and not role.group.leads:
        sys.exit(Follower(config).run())

    def request(text):
        return GenerationRequest(
            messages=[ChatMessage("user", text)],
            max_tokens=new_tokens,
            sampling=Sampling(temperature=0.0),
        )

    async def answer(engine, text):
        events = [event async for event in engine.submit(request(text))]
        done = events[-1]
        assert isinstance(done, Done), events
        reply = "".join(e.text for e in events if isinstance(e, TextDelta))
        return [reply, done.usage.cached_tokens, done.usage.output_tokens]

    async def main():
        engine = Engine(config)
        engine.start()
        await engine.load()
        # A conversation growing turn by turn (each reuses the last's prefix), then three
        # requests decoding together in one batch.
        turns = [
            await answer(engine, "Write a haiku about distributed inference." + " More." * i)
            for i in range(3)
        ]
        batch = await asyncio.gather(*[answer(engine, f"Together {j}") for j in range(3)])
        engine.close()
        print("TOKENS " + json.dumps(turns + list(batch)), flush=True)

    asyncio.run(main())
    """
)


@pytest.fixture(scope="module")
def moe_model() -> Path:
    path = ensure_test_model("tiny-moe")
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3_moe"
    return path


@pytest.fixture(scope="module")
def dense_model() -> Path:
    # "medium": 4 query and 2 KV heads divide by 2 ranks ("tiny" has 1 KV head).
    return ensure_test_model("medium")


@pytest.fixture(scope="module")
def rank_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = tmp_path_factory.mktemp("ranks") / "rank.py"
    script.write_text(RANK_SCRIPT, encoding="utf-8")
    return script


@pytest.fixture(autouse=True)
def no_rank_left_behind(rank_script: Path) -> Iterator[None]:
    yield
    # After the launch's group is killed, nothing running this script may remain.
    assert processes_running(rank_script) == [], "a rank outlived its test"


@pytest.fixture(scope="module")
def one_process(rank_script: Path) -> Callable[[Path], list[Any]]:
    """The tokens of one plain process per model, computed once."""
    return functools.cache(lambda model: single_process_tokens(rank_script, model))


def processes_running(script: Path) -> list[int]:
    """Pids of live processes whose command line names `script` (ps: Linux and macOS)."""
    listing = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listing.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 3 or str(script) not in fields[2] or fields[1].startswith("Z"):
            continue  # a kernel thread without arguments, another command, or a zombie
        if int(fields[0]) != os.getpid():
            found.append(int(fields[0]))
    return found


def free_ports(count: int) -> int:
    """A base port with `count` consecutive ports free on 127.0.0.1 (the ring listens on
    base, base+1, ...; the default 32323 would collide with a concurrent run)."""
    for _ in range(50):
        base = random.randrange(20000, 60000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def tokens_from(output: str) -> list[int]:
    lines = [line for line in output.splitlines() if line.startswith(TOKENS_MARKER)]
    assert len(lines) == 1, f"expected one token line from rank 0, got:\n{output}"
    tokens = json.loads(lines[0].removeprefix(TOKENS_MARKER))
    assert isinstance(tokens, list)
    return tokens


def single_process_tokens(script: Path, model: Path) -> list[int]:
    done = subprocess.run(
        [sys.executable, str(script), str(model), "none", str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tokens_from(done.stdout)


def launched(script: Path, model: Path, parallel: str, ranks: int) -> list[int]:
    """Rank 0's tokens from `ranks` local processes on the ring backend."""
    done = launch(script, model, parallel, ranks)
    # mlx.launch (mlx 0.32) exits 0 even when a rank fails; only its warning tells.
    assert done.returncode == 0 and RANK_FAILED not in done.stderr, (
        f"a rank failed:\n{done.stdout}\n{done.stderr}"
    )
    return tokens_from(done.stdout)


RANK_FAILED = "exited with code"  # mlx.launch's warning: "Node with rank 1 exited with code 1"


def launch(
    script: Path, model: Path, parallel: str, ranks: int
) -> subprocess.CompletedProcess[str]:
    """Run the rank script on `ranks` local processes under mlx.launch, ring backend."""
    assert MLX_LAUNCH is not None
    command = [
        MLX_LAUNCH,
        "--backend",
        "ring",
        "--hosts",
        ",".join(["127.0.0.1"] * ranks),
        "--starting-port",
        str(free_ports(ranks)),
        "--",
        sys.executable,
        str(script),
        str(model),
        parallel,
        str(NEW_TOKENS),
    ]
    # mlx.launch leaves a temporary hostfile per rank behind: keep them in the test's dir.
    env = os.environ | {"TMPDIR": str(script.parent)}
    launcher = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,  # not /dev/null: mlx.launch's stdin relay would spin on it
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the ranks join it
    )
    try:
        stdout, stderr = launcher.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        kill_group(launcher)
    return subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)


def kill_group(launch: subprocess.Popen[str]) -> None:
    """Stop mlx.launch and every rank in its group (a no-op after a clean exit)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(launch.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_alive(launch.pid):
            time.sleep(0.05)
        if not group_alive(launch.pid):
            break
    if launch.poll() is None:
        launch.wait(timeout=5)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# Pipeline on 3 ranks covers pipeline on 2 (a middle stage besides the two ends).
@pytest.mark.parametrize(("parallel", "ranks"), [("tensor", 2), ("pipeline", 3)])
def test_moe_model_sharded_decodes_like_one_process(
    moe_model: Path,
    rank_script: Path,
    one_process: Callable[[Path], list[Any]],
    parallel: str,
    ranks: int,
) -> None:
    reference = one_process(moe_model)
    assert_reused_and_full(reference)
    assert launched(rank_script, moe_model, parallel, ranks) == reference


def test_dense_model_tensor_parallel_decodes_like_one_process(
    dense_model: Path, rank_script: Path, one_process: Callable[[Path], list[Any]]
) -> None:
    reference = one_process(dense_model)
    assert_reused_and_full(reference)
    assert launched(rank_script, dense_model, "tensor", 2) == reference


def assert_reused_and_full(answers: list[Any]) -> None:
    """The reference itself is what the test means: later turns reused the earlier ones'
    prefix, and every answer ran to its length (random weights rarely end a turn early)."""
    assert len(answers) == 6
    assert answers[1][1] > 0 and answers[2][1] > answers[1][1], answers
    assert all(output == NEW_TOKENS for _, _, output in answers), answers


def test_a_rank_that_cannot_load_its_shard_is_reported_and_leaves_no_process(
    dense_model: Path, rank_script: Path
) -> None:
    # mlx-lm's qwen3 has no pipeline support: sharded_load raises on the ranks. The launch
    # must end (no hang), say why, and leave no rank behind (the fixture checks).
    done = launch(rank_script, dense_model, "pipeline", 2)
    assert "does not support pipelining" in done.stderr
    assert RANK_FAILED in done.stderr
    assert TOKENS_MARKER not in done.stdout
