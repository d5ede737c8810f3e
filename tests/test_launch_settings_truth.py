"""One source of truth for what Claude Code is told: window, output budget, compaction, ids.

`mlx launch claude`, `mlx serve`'s announcement, the state file and `--print-env` all derive
them from the window the server really serves (issue 20, item 3): a server started with
`--context-length 32768` is a 32768-token server to every one of them, and to Claude Code.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e.launching import launch_env
from rich.console import Console

from mlxlaunch.launch.claude_env import (
    ClaudeTarget,
    claude_model_id,
    client_settings,
    compaction_threshold,
    launch_variables,
)
from mlxlaunch.launch.models import ChosenModel
from mlxlaunch.launch.print_env import print_env_target
from mlxlaunch.launch.serving import EngineOptions, serving
from mlxlaunch.launch.state import ClientSettings, RunState, running_servers, write_state
from mlxlaunch.server.app import ServerSettings

MLX = [sys.executable, "-c", "from mlxlaunch.cli.main import entry; entry()"]
WINDOW = 32768  # what the servers here are started with; the test models' config says 40960

# Claude Code 2.1.332 takes an id for a Claude model (and then ignores
# CLAUDE_CODE_MAX_CONTEXT_TOKENS) when it starts with `claude-` or contains a family name:
# its canonical-name rule, read from the bundle.
CLAUDE_CODE_RECOGNISES = re.compile(
    r"^claude-|claude-(opus|sonnet|haiku|fable|mythos)|claude-3-|\[1m\]", re.IGNORECASE
)


def _exports(text: str) -> dict[str, str]:
    """The variables of `export K=V` lines (values as the shell would read the simple ones)."""
    found = re.findall(r"^export (\w+)=(.*)$", text, flags=re.MULTILINE)
    return {key: value.strip("'") for key, value in found}


# --- the derivation --------------------------------------------------------------------------


def test_settings_derive_once_and_pass_through_unchanged() -> None:
    settings = client_settings("claude-sonnet-4-6-distill", WINDOW, small_model_id="little")
    # A reader of the state file may feed them through again: nothing moves.
    again = ClaudeTarget.of("http://h:1", "t", settings).settings()
    assert again == settings
    env = launch_variables(ClaudeTarget.of("http://h:1", "t", settings))
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == str(settings.max_output_tokens)
    assert env["ANTHROPIC_MODEL"] == settings.model_id
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "little"


@pytest.mark.parametrize("window", [32768, 40960, 65536, 131072, 262144])
def test_claude_code_compacts_with_room_for_the_reply(window: int) -> None:
    settings = client_settings("qwen3", window)
    # Claude Code's rule: window - min(output budget, 20k) - 13k.
    out = settings.max_output_tokens
    assert settings.compact_at == window - min(out, 20_000) - 13_000
    assert settings.compact_at == compaction_threshold(window, out)
    # A prompt at the compaction point still has the whole output budget before the window ends.
    assert settings.compact_at + out <= window
    # ...and that point is not below Claude Code's own ~12k-token first prompt: on 32k it was
    # 11576 with a quarter-window budget, so Claude Code compacted before its first reply.
    assert settings.compact_at >= window // 2


def test_an_asked_for_budget_moves_the_compaction_point_with_it() -> None:
    settings = client_settings("tiny", WINDOW, max_output=512)
    assert settings.max_output_tokens == 512
    assert settings.compact_at == WINDOW - 512 - 13_000
    assert client_settings("tiny", 4096, max_output=8192).max_output_tokens == 4096


@pytest.mark.parametrize(
    "name",
    [
        "claude-local",
        "local-claude-sonnet-4-6",
        "my-claude-opus-4-7-distill",
        "org/claude-3-5-haiku-mlx",
        "Claude-Haiku-4-5",
        "qwen[1m]",
    ],
)
def test_chosen_ids_keep_claude_code_honouring_the_window(name: str) -> None:
    model_id = client_settings(name, WINDOW).model_id
    assert not CLAUDE_CODE_RECOGNISES.search(model_id), model_id
    assert claude_model_id(model_id) == model_id


# --- --print-env with --url: the server says -----------------------------------------------


def _models_endpoint(entry: dict[str, object]) -> httpx.MockTransport:
    """A server whose `GET /v1/models` lists `entry` (checks the bearer token)."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        assert request.headers["authorization"] == "Bearer tok"
        return httpx.Response(200, json={"data": [entry], "has_more": False})

    return httpx.MockTransport(answer)


def test_print_env_with_url_reads_window_and_output_cap_from_the_server(tmp_path: Path) -> None:
    served = {"id": "qwen3-8b", "type": "model", "max_input_tokens": WINDOW, "max_tokens": WINDOW}
    target = print_env_target(
        url="http://10.0.0.5:8080",
        token="tok",
        home=tmp_path,
        transport=_models_endpoint(served),
    )
    env = launch_variables(target)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == str(
        client_settings("x", WINDOW).max_output_tokens
    )
    assert env["ANTHROPIC_MODEL"] == "qwen3-8b"
    # A server whose own output cap is lower wins over the window's budget.
    capped = {**served, "max_tokens": 1500}
    target = print_env_target(
        url="http://10.0.0.5:8080", token="tok", home=tmp_path, transport=_models_endpoint(capped)
    )
    assert launch_variables(target)["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "1500"


def test_print_env_invents_no_window_the_server_does_not_state(tmp_path: Path) -> None:
    target = print_env_target(
        url="http://10.0.0.5:8080",
        token="tok",
        home=tmp_path,
        transport=_models_endpoint({"id": "qwen3-8b", "type": "model"}),
    )
    env = launch_variables(target)
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in env
    assert env["ANTHROPIC_MODEL"] == "qwen3-8b"


def test_print_env_prefers_the_record_to_the_model_config(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    recorded = client_settings("qwen3", WINDOW)
    write_state(
        RunState(os.getpid(), "http://127.0.0.1:9", "tok", "qwen3", str(model_dir), "", "serve",
                 client=recorded),
        home=tmp_path,
    )  # fmt: skip
    for url, token in ((None, None), ("http://127.0.0.1:9", "tok")):
        env = launch_variables(print_env_target(url=url, token=token, home=tmp_path))
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)  # not config.json's 131072
        assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == str(recorded.max_output_tokens)
    [state] = running_servers(tmp_path)
    assert state.client == recorded


# --- real servers ------------------------------------------------------------------------------


@pytest.mark.slow
def test_in_process_server_records_what_its_engine_serves(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    chosen = ChosenModel("tiny", tiny_model_dir, "--model")
    with serving(
        chosen,
        EngineOptions(context_length=WINDOW, cache_dir=tmp_path / "cache"),
        ServerSettings(auth_token="tok", model_id="tiny"),
        kind="launch",
        console=Console(file=io.StringIO()),
        load="now",
        max_output_tokens=512,
    ) as served:
        info = served.engine.model_info
        assert info is not None and info.context_window == WINDOW
        assert served.client == client_settings("tiny", WINDOW, max_output=512)
        [state] = running_servers()
        assert state.client == served.client
        launched = launch_variables(ClaudeTarget.of(served.url, "tok", served.client))
        printed = launch_variables(print_env_target())
        assert printed == launched
        assert printed["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)


@pytest.fixture(scope="module")
def mlx_serve(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[str, str, str, dict]]:
    """`mlx serve --model TINY --context-length 32768` in a child process: its URL, token,
    announcement and environment (its own MLXLAUNCH_HOME). One for the module: its tests only
    read what it says."""
    tmp_path = tmp_path_factory.mktemp("mlx-serve")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        MLXLAUNCH_HOME=str(tmp_path / "home"),
        MLXLAUNCH_CONFIG_DIR=str(tmp_path / "config"),
    )
    env.pop("MLX_AUTH_TOKEN", None)
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0"]
    args += ["--context-length", str(WINDOW), "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(
        [*MLX, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        said = _announcement(proc, time.monotonic() + 120)
        url = re.search(r"serving \S+ at (http://\S+)", said)
        assert url is not None, said
        yield url.group(1), _exports(said)["ANTHROPIC_AUTH_TOKEN"], said, env
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _announcement(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    said: list[str] = []
    while not said or "Press Ctrl-C" not in said[-1]:
        assert time.monotonic() < deadline, "mlx serve did not announce itself in time"
        line = proc.stdout.readline()
        if not line:
            assert proc.poll() is None, f"mlx serve exited with {proc.returncode}: " + (
                proc.stderr.read() if proc.stderr else ""
            )
            continue
        said.append(line)
    return "".join(said)


def _print_env(env: dict[str, str], *args: str) -> dict[str, str]:
    done = subprocess.run(
        [*MLX, "launch", "claude", "--print-env", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return _exports(done.stdout)


@pytest.mark.slow
def test_mlx_serve_with_context_length_is_32768_everywhere(
    mlx_serve: tuple[str, str, str, dict],
) -> None:
    url, token, announcement, env = mlx_serve
    announced = _exports(announcement)
    assert announced["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)
    [state] = running_servers(Path(env["MLXLAUNCH_HOME"]))
    assert state.client is not None and state.client.context_window == WINDOW
    # The state file, `--print-env` and `--print-env --url --token` say what the server said.
    assert _print_env(env) == announced
    assert _print_env(env, "--url", url, "--token", token) == announced
    settings = state.client
    assert settings.compact_at == compaction_threshold(WINDOW, settings.max_output_tokens)
    assert announced["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == str(settings.max_output_tokens)


@pytest.mark.slow
def test_print_env_url_of_a_server_with_no_record_here(
    mlx_serve: tuple[str, str, str, dict], tmp_path: Path
) -> None:
    url, token, announcement, env = mlx_serve
    elsewhere = {**env, "MLXLAUNCH_HOME": str(tmp_path / "other-home")}
    printed = _print_env(elsewhere, "--url", url, "--token", token)
    assert printed["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)
    assert printed == _exports(announcement)


def test_state_record_round_trips_the_client_settings(tmp_path: Path) -> None:
    settings = ClientSettings("qwen3", "qwen3", WINDOW, 3384, 16384)
    write_state(RunState(os.getpid(), "http://x", "t", "m", "/m", "", client=settings), tmp_path)
    [state] = running_servers(tmp_path)
    assert state.client == settings


# --- Claude Code itself (the pinned release) ---------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("model_id", [None, "claude-sonnet-4-6-distill"])
def test_claude_code_takes_the_served_window(
    tmp_path: Path, real_claude: Path, model_id: str | None
) -> None:
    """`mlx launch claude --context-length 32768 -- -p`: Claude Code's own debug log shows the
    window it compacts against, 32768 less the output budget, also for an id that names a
    Claude model (as-is, Claude Code would take it for Sonnet 4.6 with a 200k window).

    Claude Code still prints `[claude-code:unrecognized_model]` once: it does so for every id
    that is not a Claude model, and a Claude id would lose the window.
    """
    work, debug_log = tmp_path / "work", tmp_path / "claude-debug.log"
    work.mkdir()
    env = launch_env(tmp_path)
    ids = [] if model_id is None else ["--env", f"ANTHROPIC_MODEL={claude_model_id(model_id)}"]
    done = subprocess.run(
        [
            *MLX, "launch", "claude", "--model", "demo", "--claude-bin", str(real_claude),
            "--context-length", str(WINDOW), *ids,
            "--", "-p", "hello", "--debug-file", str(debug_log),
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    budget = client_settings("demo", WINDOW, max_output=512).max_output_tokens  # the demo's cap
    windows = set(re.findall(r"autocompact: .*effectiveWindow=(\d+)", debug_log.read_text()))
    assert windows == {str(WINDOW - budget)}, debug_log.read_text()[-2000:]
