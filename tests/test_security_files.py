"""What the product writes to disk: state and log files are the user's alone, the auth token
never reaches a log, each launch has its own token, and the prefix cache's files are named by
hashes, never by anything a request chose."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cli_process import run_mlx

from mlxlaunch.engine.cache.disk import DiskCache, model_identity
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.launch.server_log import logging_to, new_log_path
from mlxlaunch.launch.state import RunState, write_state
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server

TOKEN = "do-not-log-me-7f3a9c1e5b2d4f60"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_and_log_files_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # a typical umask must not widen the modes
    try:
        state = write_state(RunState(1, "http://x", TOKEN, "m", "/m", ""), home=tmp_path)
        log = new_log_path(home=tmp_path)
    finally:
        os.umask(old_umask)
    assert _mode(state) == 0o600 and _mode(state.parent) == 0o700
    assert _mode(log) == 0o600 and _mode(log.parent) == 0o700


@pytest.fixture
def logged_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log_file = new_log_path(home=tmp_path)
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    # The most verbose setting there is: nothing at any level may carry the token.
    with logging_to(log_file, level=logging.DEBUG):
        engine.start()
        try:
            settings = ServerSettings(auth_token=TOKEN)
            with start_server(engine, settings, log_level="debug") as handle:
                yield handle.url, log_file
        finally:
            engine.close()


@pytest.mark.slow
def test_the_token_never_reaches_the_log(logged_server: tuple[str, Path]) -> None:
    url, log_file = logged_server
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    good = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url + "/v1/messages", json=body, headers=good, timeout=60).status_code == 200
    streamed = httpx.post(url + "/v1/messages", json={**body, "stream": True}, headers=good)
    assert streamed.status_code == 200
    for headers in (
        {"authorization": f"Bearer {TOKEN}x"},  # a near miss
        {"x-api-key": TOKEN, "host": "evil.example"},
        {"x-api-key": TOKEN, "origin": "https://evil.example"},
    ):
        assert httpx.post(url + "/v1/messages", json=body, headers=headers).status_code >= 400
    bad_body = {**body, "max_tokens": "many"}
    assert httpx.post(url + "/v1/messages", json=bad_body, headers=good).status_code == 400
    text = log_file.read_text()
    assert "status=200" in text  # the request log is there ...
    assert TOKEN not in text  # ... and the token is not


def _launch(world: Path, *claude_args: str, model: Path) -> tuple[dict, list[Path]]:
    from e2e.claude_cli import write_fake_claude

    claude = write_fake_claude(world / "bin")
    report = world / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        MLXLAUNCH_HOME=str(world / "home"),
        MLXLAUNCH_CONFIG_DIR=str(world / "config"),
        HF_HUB_CACHE=str(world / "hub"),
        FAKE_CLAUDE_REPORT=str(report),
    )
    launch = ["launch", "claude", "--claude-bin", str(claude), "--model", str(model)]
    done = run_mlx([*launch, "--", *claude_args], env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(report.read_text())
    assert seen["env"]["ANTHROPIC_AUTH_TOKEN"] not in done.stdout + done.stderr
    return seen, sorted((world / "home" / "logs").glob("launch-*.log"))


@pytest.mark.slow
def test_each_launch_has_its_own_token_kept_out_of_its_log(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    first, logs = _launch(tmp_path, "request", model=tiny_model_dir)
    assert first["status"] == 200
    second, logs = _launch(tmp_path, "exit", "0", model=tiny_model_dir)
    tokens = [seen["env"]["ANTHROPIC_AUTH_TOKEN"] for seen in (first, second)]
    assert tokens[0] != tokens[1] and all(len(t) >= 32 for t in tokens)
    assert len(logs) == 2
    for log in logs:
        assert _mode(log) == 0o600
        assert not any(token in log.read_text() for token in tokens)


# --- the prefix cache's disk tier -------------------------------------------------------------


def _saved_cache(root: Path) -> tuple[DiskCache, Path]:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = KVCache()
    keys = mx.zeros((1, 2, 4, 8))
    cache.update_and_fetch(keys, keys)
    store = DiskCache(root, "0" * 24, budget_bytes=1 << 30)
    entry = store.save([1, 2, 3, 4], [cache])
    assert entry is not None
    return store, root


def test_disk_cache_names_are_hashes_inside_its_directory(tmp_path: Path) -> None:
    store, root = _saved_cache(tmp_path / "cache")
    identity = model_identity(tmp_path, ["KVCache"])
    assert all(c in "0123456789abcdef" for c in identity)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert path.resolve().is_relative_to(root.resolve())
        assert all(c in "0123456789abcdef" for c in path.name.split(".")[0]), path.name
    # An entry whose name and content disagree (a crafted file) is dropped, never loaded.
    meta = next(p for p in files if p.suffix == ".json")
    crafted = meta.with_name("0" * 32 + ".json")
    crafted.write_text(meta.read_text())
    store.scan()
    assert not crafted.exists()


def test_disk_cache_files_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        _, root = _saved_cache(tmp_path / "cache")
    finally:
        os.umask(old_umask)
    for path in [root, *root.rglob("*")]:
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), path
