"""Issue 19, item 11 (part): what mlxlaunch creates has its own modes, whatever the umask.

Under `umask 000`, `mkdir(parents=True)` made the home (run-state records with tokens, logs
with prompts, the prompt cache) and the test-model directories 0777: anyone on the machine
could read them or swap files in. Directories of private state must come out 0700 and their
secret files 0600; model directories 0755 with files 0644.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from run_records import run_record

from mlxlaunch import config
from mlxlaunch.engine.cache.disk import DiskCache
from mlxlaunch.home import make_dirs, private_dir, shared_dir
from mlxlaunch.launch.server_log import new_log_path
from mlxlaunch.launch.state import write_state
from mlxlaunch.store import registry


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """Run each test under the most permissive umask (restored after)."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_below(root: Path) -> dict[str, int]:
    """Mode of `root` and of everything under it, by path relative to root's parent."""
    found = {root.name: mode(root)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root.parent))] = mode(path)
    return found


def test_private_and_shared_dirs_get_their_mode_with_every_missing_parent(tmp_path: Path) -> None:
    private = private_dir(tmp_path / "home" / "run")
    shared = shared_dir(tmp_path / "models" / "tiny")
    assert mode(tmp_path / "home") == mode(private) == 0o700
    assert mode(tmp_path / "models") == mode(shared) == 0o755


def test_existing_directories_keep_their_mode(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir(mode=0o750)
    os.chmod(chosen, 0o750)
    private_dir(chosen / "run")
    assert mode(chosen) == 0o750 and mode(chosen / "run") == 0o700


def test_a_umask_that_removes_owner_bits_still_gives_the_mode(tmp_path: Path) -> None:
    os.umask(0o277)  # the fixture restores the real one
    made = make_dirs(tmp_path / "a" / "b", 0o700)
    assert mode(tmp_path / "a") == mode(made) == 0o700


def test_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("not a directory")
    with pytest.raises(FileExistsError):
        private_dir(tmp_path / "home")
    with pytest.raises(NotADirectoryError):
        private_dir(tmp_path / "home" / "run")


def test_run_state_home_and_record_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    record = write_state(
        run_record(4242, token="secret"),
        home=home,
    )
    assert mode(home) == 0o700
    assert mode(record.parent) == 0o700
    assert mode(record) == 0o600


def test_logs_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = new_log_path(home, pid=4242)
    assert mode(home) == mode(log.parent) == 0o700
    assert mode(log) == 0o600


def test_the_model_registry_home_is_private(tmp_path: Path) -> None:
    path = tmp_path / "home" / "models.json"
    registry.register_local("mine", tmp_path, path=path)
    assert mode(path.parent) == 0o700
    assert mode(path) == 0o600


def test_the_config_directory_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "config" / "mlxlaunch"
    monkeypatch.setenv(config.CONFIG_DIR_ENV, str(directory))
    config.set_value("port", "8080")
    assert mode(tmp_path / "config") == mode(directory) == 0o700


def test_the_prompt_cache_identity_directory_and_entries_are_private(tmp_path: Path) -> None:
    root = tmp_path / "home" / "prompt-cache"
    kv = KVCache()
    keys = mx.zeros((1, 2, 32, 8), dtype=mx.float16)
    kv.update_and_fetch(keys, keys)
    disk = DiskCache(root, "model-a", 1 << 30)
    entry = disk.save(list(range(32)), [kv])
    assert entry is not None
    found = modes_below(tmp_path / "home")
    directories = {name: m for name, m in found.items() if (tmp_path / name).is_dir()}
    files = {name: m for name, m in found.items() if (tmp_path / name).is_file()}
    assert set(directories.values()) == {0o700}, directories
    assert files and set(files.values()) == {0o600}, files


@pytest.mark.slow
def test_a_built_test_model_is_not_writable_by_others(tmp_path: Path) -> None:
    from mlxlaunch.testing.builder import build_model

    model = build_model(tmp_path / "models" / "tiny", "tiny")
    assert mode(tmp_path / "models") == mode(model) == 0o755
    files = {path.name: mode(path) for path in model.iterdir()}
    assert "model.safetensors" in files and set(files.values()) == {0o644}, files


@pytest.mark.slow
def test_the_test_model_cache_lives_in_a_private_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxlaunch.testing.cache import HOME_ENV, ensure_test_model

    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    model = ensure_test_model("tiny")
    assert mode(home) == mode(home / "test-models") == 0o700
    assert all(mode(path) & 0o022 == 0 for path in model.rglob("*")), modes_below(model)
