"""`mlx launch claude` as a user runs it: a real process, a real server, a stand-in `claude`.

The stand-in (tests/e2e/claude_cli.py) reports what it saw, so these tests check the exact
environment, the exit code, signals, the state file and the freed port without Node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from cli_process import MLX, run_mlx
from e2e.claude_cli import write_fake_claude
from test_claude_install import _fake_npm, _npm_args

from mlxlaunch.launch.claude_bin import CLAUDE_CODE_VERSION, npm_install_command
from mlxlaunch.store.catalog import recommend
from mlxlaunch.store.memory import format_bytes

# The console script's own entry point, run by this interpreter.


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """Private homes for state, config, hub cache and the stand-in claude."""
    paths = {name: tmp_path / name for name in ("home", "config", "hub", "bin")}
    paths["report"] = tmp_path / "report.json"
    paths["claude"] = write_fake_claude(paths["bin"])
    return paths


def _env(world: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        MLXLAUNCH_HOME=str(world["home"]),
        MLXLAUNCH_CONFIG_DIR=str(world["config"]),
        HF_HUB_CACHE=str(world["hub"]),
        FAKE_CLAUDE_REPORT=str(world["report"]),
    )
    env.update(extra)
    return env


_mlx = run_mlx


def _report(world: dict[str, Path]) -> dict:
    return json.loads(world["report"].read_text())


def _port_is_free(url: str) -> bool:
    port = urlparse(url).port
    assert port is not None
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_environment_wiring_exit_code_and_cleanup(
    world: dict[str, Path], tiny_model_dir: Path
) -> None:
    env = _env(
        world, ANTHROPIC_API_KEY="sk-users-own", CLAUDE_CODE_USE_BEDROCK="1", MY_OWN_SETTING="kept"
    )
    done = _mlx(
        [
            "launch",
            "claude",
            "--claude-bin",
            str(world["claude"]),
            "--model",
            str(tiny_model_dir),
            "--env",
            "EXTRA_ONE=1",
            "--verbose",
            "--",
            "exit",
            "3",
            "--some-flag",
            "two words",
        ],
        env,
    )
    assert done.returncode == 3, done.stderr
    seen = _report(world)
    child = seen["env"]
    url = child["ANTHROPIC_BASE_URL"]
    assert urlparse(url).hostname == "127.0.0.1" and urlparse(url).path == ""
    assert len(child["ANTHROPIC_AUTH_TOKEN"]) >= 32
    model_id = tiny_model_dir.name
    assert {
        k: child[k]
        for k in (
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_MODEL",
            "ANTHROPIC_DEFAULT_OPUS_MODEL",
            "ANTHROPIC_DEFAULT_SONNET_MODEL",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL",
            "CLAUDE_CODE_SUBAGENT_MODEL",
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            "API_TIMEOUT_MS",
            "CLAUDE_CODE_ATTRIBUTION_HEADER",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
            "DISABLE_TELEMETRY",
            "EXTRA_ONE",
            "MY_OWN_SETTING",
        )
    } == {
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": model_id,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model_id,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model_id,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model_id,
        "CLAUDE_CODE_SUBAGENT_MODEL": model_id,
        # The test model's config declares 40960 positions; a quarter of it goes to output.
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "40960",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "7480",  # 40960 window: compacts at half
        "API_TIMEOUT_MS": "3600000",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "EXTRA_ONE": "1",
        "MY_OWN_SETTING": "kept",
    }
    assert "CLAUDE_CODE_USE_BEDROCK" not in child
    assert seen["argv"] == ["exit", "3", "--some-flag", "two words"]
    # The log path was announced before claude started; the server is gone, the port free.
    assert "server log:" in done.stderr
    said = " ".join(done.stderr.split())  # rich wraps long lines at the terminal's width
    assert "9.9.9 (Fake Claude)" in said  # --verbose names claude's version
    assert "mlx dash" in said  # how to watch the server live
    assert list((world["home"] / "run").glob("*.json")) == []
    assert _port_is_free(url)


@pytest.mark.slow
def test_claude_reaches_our_server_and_the_log_shows_the_request(
    world: dict[str, Path], tiny_model_dir: Path
) -> None:
    done = _mlx(
        [
            "launch",
            "claude",
            "--claude-bin",
            str(world["claude"]),
            "--preload",
            "--model",
            str(tiny_model_dir),
            "--",
            "request",
        ],
        _env(world),
    )
    assert done.returncode == 0, done.stderr
    seen = _report(world)
    assert seen["status"] == 200
    message_id = seen["body"]["id"]
    logs = list((world["home"] / "logs").glob("launch-*.log"))
    assert len(logs) == 1
    assert message_id in logs[0].read_text()  # answered by this launch's server
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600
    # Nothing from the server reached the terminal while claude ran.
    assert message_id not in done.stderr and message_id not in done.stdout


@pytest.mark.slow
def test_sigint_reaches_claude_and_state_file_lives_only_while_running(
    world: dict[str, Path], tiny_model_dir: Path
) -> None:
    launcher = subprocess.Popen(
        [
            *MLX,
            "launch",
            "claude",
            "--claude-bin",
            str(world["claude"]),
            "--model",
            str(tiny_model_dir),
            "--",
            "wait-signal",
        ],
        env=_env(world),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (world["report"].exists() and _report(world)["ready"]):
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        state_file = world["home"] / "run" / f"{launcher.pid}.json"
        state = json.loads(state_file.read_text())
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        child_env = _report(world)["env"]
        assert state["url"] == child_env["ANTHROPIC_BASE_URL"]
        assert state["token"] == child_env["ANTHROPIC_AUTH_TOKEN"]
        assert state["kind"] == "launch" and state["model_path"] == str(tiny_model_dir)
        # A second shell finds the running server through the state file.
        printed = _mlx(["launch", "claude", "--print-env"], _env(world))
        assert printed.returncode == 0, printed.stderr
        assert f"export ANTHROPIC_BASE_URL={state['url']}" in printed.stdout.splitlines()
        assert f"export ANTHROPIC_AUTH_TOKEN={state['token']}" in printed.stdout.splitlines()

        os.kill(launcher.pid, signal.SIGINT)
        assert launcher.wait(timeout=30) == 40 + signal.SIGINT
        assert _report(world)["signals"] == [signal.SIGINT]
        assert not state_file.exists()
        assert _port_is_free(state["url"])
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.communicate()


@pytest.mark.slow
def test_missing_claude_says_how_to_install(world: dict[str, Path], tiny_model_dir: Path) -> None:
    env = _env(world, PATH=str(world["bin"].parent / "empty"))
    done = _mlx(["launch", "claude", "--model", str(tiny_model_dir)], env)
    assert done.returncode == 6
    said = "".join(done.stderr.split())  # rich wraps long lines, even inside a path
    pinned = world["home"] / "claude-code" / CLAUDE_CODE_VERSION
    assert f"`claude`wasnotfoundonPATHnorat{pinned}" in said
    assert "mlxlaunchclaude--install-claude" in said and "npminstall-g" not in said
    assert not (world["home"] / "logs").exists()  # failed before anything started


@pytest.mark.slow
def test_no_model_names_the_pull_command(world: dict[str, Path]) -> None:
    env = _env(world, PATH=f"{world['bin']}{os.pathsep}{os.environ['PATH']}")
    done = _mlx(["launch", "claude"], env)
    assert done.returncode == 3, done.stderr
    assert "no model to launch" in done.stderr
    assert "mlx models pull " in done.stderr
    # --yes goes on to pull the recommended model (here from a hub that is not there).
    offline = _mlx(["launch", "claude", "--yes"], {**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 5, offline.stderr
    assert "cannot reach the hub at http://127.0.0.1:9" in offline.stderr


@pytest.mark.slow
def test_default_model_setting_is_used(world: dict[str, Path], tiny_model_dir: Path) -> None:
    env = _env(world, PATH=f"{world['bin']}{os.pathsep}{os.environ['PATH']}")
    assert _mlx(["config", "set", "default-model", str(tiny_model_dir)], env).returncode == 0
    got = _mlx(["config", "get", "default-model"], env)
    assert got.stdout.strip() == str(tiny_model_dir)
    done = _mlx(["launch", "claude", "--context-length", "16384", "--", "exit", "0"], env)
    assert done.returncode == 0, done.stderr
    child = _report(world)["env"]
    assert child["ANTHROPIC_MODEL"] == tiny_model_dir.name
    assert child["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "16384"


@pytest.mark.slow
def test_print_env_without_a_server_or_with_url_and_token(world: dict[str, Path]) -> None:
    missing = _mlx(["launch", "claude", "--print-env"], _env(world))
    assert missing.returncode != 0
    assert "no mlx server found" in missing.stderr
    given = _mlx(
        [
            "launch",
            "claude",
            "--print-env",
            "--url",
            "http://127.0.0.1:9",
            "--token",
            "abc",
            "--context-length",
            "32768",
        ],
        _env(world),
    )
    assert given.returncode == 0, given.stderr
    lines = given.stdout.splitlines()
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:9" in lines
    assert "export ANTHROPIC_AUTH_TOKEN=abc" in lines
    assert "export ANTHROPIC_API_KEY=''" in lines
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=32768" in lines


@pytest.mark.slow
def test_test_models_get_a_short_output_budget(world: dict[str, Path]) -> None:
    """Random-weight models rarely stop on their own: the demo must not stream noise for minutes."""
    done = _mlx(
        ["launch", "claude", "--claude-bin", str(world["claude"]), "--model", "tiny", "--", "exit"],
        _env(world),
    )
    assert done.returncode == 0, done.stderr
    assert _report(world)["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512"
    # An explicit budget still wins.
    done = _mlx(
        [
            "launch", "claude", "--claude-bin", str(world["claude"]), "--model", "tiny",
            "--max-output-tokens", "2000", "--", "exit",
        ],
        _env(world),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _report(world)["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "2000"


def _mlx_on_a_terminal(
    args: list[str], env: dict[str, str], answer: str, *, stdout_too: bool = True
) -> tuple[int, str]:
    """Run mlx with a pseudo-terminal as stdin (so it may ask) and stdout (unless not
    `stdout_too`: then a pipe), type `answer`, return the exit code and its stderr."""
    controller, terminal = os.openpty()
    try:
        process = subprocess.Popen(
            [*MLX, *args],
            env=env,
            stdin=terminal,
            stdout=terminal if stdout_too else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(controller, answer.encode())
        _, stderr = process.communicate(timeout=120)
    finally:
        os.close(terminal)
        os.close(controller)
    return process.returncode, stderr


@pytest.mark.slow
def test_on_a_terminal_it_offers_to_pull_the_recommended_model(world: dict[str, Path]) -> None:
    env = _env(
        world,
        PATH=f"{world['bin']}{os.pathsep}{os.environ['PATH']}",
        HF_ENDPOINT="http://127.0.0.1:9",  # a hub that is not there
    )
    # "n", or just Enter (no is the default): nothing is pulled, and the error says how to
    # get a model. The question names the download size.
    entry = recommend()
    assert entry is not None
    for answer in ("n\n", "\n"):
        code, stderr = _mlx_on_a_terminal(["launch", "claude"], env, answer)
        said = " ".join(stderr.split())
        assert "No model is downloaded. Pull the recommended" in said
        assert f"{format_bytes(entry.size_bytes)} download" in said
        assert code == 3, stderr
        assert "mlx models pull " in stderr and "cannot reach the hub" not in stderr
    # "y": it goes on to pull, here from the missing hub.
    code, stderr = _mlx_on_a_terminal(["launch", "claude"], env, "y\n")
    assert code == 5, stderr
    assert "cannot reach the hub at http://127.0.0.1:9" in stderr


@pytest.mark.slow
def test_piped_output_is_refused_before_anything_starts(world: dict[str, Path]) -> None:
    """`make run | tee log`: claude would go non-interactive with no prompt and quit."""
    env = _env(world, PATH=str(world["bin"].parent / "empty"))  # no claude: checked first
    code, stderr = _mlx_on_a_terminal(
        ["launch", "claude", "--model", "tiny"], env, "", stdout_too=False
    )
    said = " ".join(stderr.split())
    assert code == 2, stderr
    assert "is not a terminal" in said and '-- -p "your prompt"' in said
    assert not (world["home"] / "logs").exists() and not (world["home"] / "run").exists()


@pytest.mark.slow
def test_on_a_terminal_it_offers_to_install_claude_code(
    world: dict[str, Path], tiny_model_dir: Path
) -> None:
    npm_dir = world["bin"].parent / "npm-bin"
    _fake_npm(npm_dir)  # installs a `claude` that prints its version and exits 0
    env = _env(world, PATH=str(npm_dir))
    args = ["launch", "claude", "--model", str(tiny_model_dir)]
    prefix = world["home"] / "claude-code" / CLAUDE_CODE_VERSION
    code, stderr = _mlx_on_a_terminal(args, env, "n\n")
    said = "".join(stderr.split())
    assert code == 6, stderr
    assert f"Install@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}into{prefix}?" in said
    assert "--install-claude" in said and _npm_args(npm_dir) is None
    code, stderr = _mlx_on_a_terminal(args, env, "y\n")
    assert code == 0, stderr
    assert _npm_args(npm_dir) == npm_install_command(prefix)[1:]
    # Later launches find it without asking, with or without a terminal.
    (npm_dir / "npm-args.json").unlink()
    done = _mlx(args, env)
    assert done.returncode == 0, done.stderr
    assert _npm_args(npm_dir) is None
