"""`mlx models pull` against a local hub, with the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from fakehub import NON_MLX_FILES, TINY_REPO, FakeHub, FakeRepo

from mlxlaunch.cli.error_text import error_text
from mlxlaunch.errors import ModelNotFound, NetworkError
from mlxlaunch.store import (
    NotAnMlxModel,
    list_models,
    plan_pull,
    pull,
    resolve_model,
)
from mlxlaunch.store.progress import SilentProgress

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

GIB = 1024**3


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_same_files(snapshot: Path, repo: FakeRepo, names: list[str]) -> None:
    for name in names:
        assert _sha256(snapshot / name) == repo.files[name].sha256, name


def test_pull_fetches_exactly_the_mlx_files_and_the_model_loads(
    hub: FakeHub, hub_cache: Path, tiny_model_dir: Path
) -> None:
    plan = plan_pull(TINY_REPO, total_memory=16 * GIB)
    expected = sorted(p.name for p in tiny_model_dir.iterdir() if p.is_file())
    assert sorted(f.name for f in plan.files) == expected
    assert set(plan.skipped) == set(NON_MLX_FILES)
    assert plan.problems == ()
    assert plan.fit.fits
    assert plan.total_bytes == sum((tiny_model_dir / n).stat().st_size for n in expected)

    progress = SilentProgress()
    result = pull(plan, progress=progress)

    assert progress.total == plan.total_bytes and progress.already == 0
    assert progress.received == plan.total_bytes
    assert progress.ended
    fetched = {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
    assert fetched == set(expected)  # no .bin, .gguf, original/ or README downloads
    assert sorted(p.name for p in result.path.iterdir()) == expected
    assert result.report.ok, result.report.problems
    _assert_same_files(result.path, hub.repos[TINY_REPO], expected)

    [model] = list_models()
    assert model.repo_id == TINY_REPO and model.complete
    assert model.revision == hub.repos[TINY_REPO].commit
    assert model.facts.model_type == "qwen3"
    assert resolve_model(TINY_REPO).path == result.path

    import mlx_lm

    tokenizer = mlx_lm.load(str(result.path))[1]
    assert tokenizer.encode("hello")


def test_second_pull_downloads_nothing(hub: FakeHub) -> None:
    pull(plan_pull(TINY_REPO))
    before = len(hub.gets_of("model.safetensors"))
    progress = SilentProgress()
    result = pull(plan_pull(TINY_REPO), progress=progress)
    assert progress.already == progress.total and progress.received == 0
    assert result.downloaded_bytes == 0
    assert len(hub.gets_of("model.safetensors")) == before


def test_dropped_connection_is_resumed_with_a_range_request(hub: FakeHub) -> None:
    hub.drop_once("model.safetensors", after_bytes=300_000)
    result = pull(plan_pull(TINY_REPO))
    assert hub.gets_of("model.safetensors") == [None, "bytes=300000-"]
    _assert_same_files(result.path, hub.repos[TINY_REPO], ["model.safetensors"])


def test_interrupted_pull_resumes_on_the_next_pull(hub: FakeHub, hub_cache: Path) -> None:
    # The connection drops mid-file and the hub stays down: the pull fails cleanly...
    hub.drop_once("model.safetensors", after_bytes=500_000, then_go_down=True)
    with pytest.raises(NetworkError) as failed:
        pull(plan_pull(TINY_REPO))
    assert "resume" in (failed.value.hint or "")
    # ... leaving no half-registered model anywhere.
    assert list_models() == []
    with pytest.raises(ModelNotFound):
        resolve_model(TINY_REPO)
    partials = list(hub_cache.glob("*/blobs/*.incomplete"))
    assert [p.stat().st_size for p in partials] == [500_000]

    hub.come_back()
    progress = SilentProgress()
    result = pull(plan_pull(TINY_REPO), progress=progress)
    assert hub.gets_of("model.safetensors")[-1] == "bytes=500000-"
    assert progress.already >= 500_000
    _assert_same_files(result.path, hub.repos[TINY_REPO], ["model.safetensors", "config.json"])
    assert not list(hub_cache.glob("*/blobs/*.incomplete"))
    assert [m.repo_id for m in list_models()] == [TINY_REPO]


class _CtrlC(SilentProgress):
    """Presses Ctrl-C once the weights are half in."""

    def advance(self, n: int) -> None:
        super().advance(n)
        if self.files[-1] == "model.safetensors" and self.received > 1_000_000:
            raise KeyboardInterrupt


def test_ctrl_c_leaves_no_half_registered_model(hub: FakeHub) -> None:
    with pytest.raises(KeyboardInterrupt):
        pull(plan_pull(TINY_REPO), progress=_CtrlC())
    assert list_models() == []
    with pytest.raises(ModelNotFound, match="not downloaded"):
        resolve_model(TINY_REPO)
    result = pull(plan_pull(TINY_REPO))
    assert hub.gets_of("model.safetensors")[-1] not in (None, "bytes=0-")
    _assert_same_files(result.path, hub.repos[TINY_REPO], ["model.safetensors"])


def test_repo_without_safetensors_is_refused_with_the_reason(hub: FakeHub, hub_cache: Path) -> None:
    plan = plan_pull("test-org/torch-only")
    assert any("no safetensors" in p and ".bin" in p for p in plan.problems)
    with pytest.raises(NotAnMlxModel, match="no safetensors") as refused:
        pull(plan)
    assert "--force" in (error_text(refused.value)[1] or "")
    assert not hub_cache.exists() or not any(hub_cache.iterdir())


def test_unknown_architecture_is_refused_unless_forced(hub: FakeHub) -> None:
    plan = plan_pull("test-org/unknown-arch")
    assert plan.problems == ("unsupported architecture 'frobnicator' (not in mlx-lm)",)
    with pytest.raises(NotAnMlxModel, match="frobnicator"):
        pull(plan)
    forced = pull(plan, force=True)
    assert not forced.report.ok
    assert any("frobnicator" in p for p in forced.report.problems)


def test_name_not_on_the_hub_is_a_clear_not_found(hub: FakeHub) -> None:
    with pytest.raises(ModelNotFound, match="no model 'test-org/nope' on the hub"):
        plan_pull("test-org/nope")
    with pytest.raises(ModelNotFound, match="revision"):
        plan_pull(TINY_REPO, revision="v9")
    with pytest.raises(ModelNotFound, match="neither a catalog alias"):
        plan_pull("not-an-alias")


def test_no_network_is_a_clear_offline_error(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(NetworkError, match="cannot reach the hub") as offline:
        plan_pull(TINY_REPO)
    assert "network" in (offline.value.hint or "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NetworkError, match="HF_HUB_OFFLINE"):
        plan_pull(TINY_REPO)


def test_a_hub_outage_is_a_network_error(hub: FakeHub) -> None:
    hub.go_down()
    with pytest.raises(NetworkError, match="503"):
        plan_pull(TINY_REPO)


def test_memory_fit_is_stated_for_the_given_machine(hub: FakeHub) -> None:
    assert plan_pull(TINY_REPO, total_memory=64 * GIB).fit.fits
    small = plan_pull(TINY_REPO, total_memory=1 * GIB).fit
    assert not small.fits and "does NOT fit" in small.describe()


def test_rich_progress_shows_bytes_speed_and_eta(hub: FakeHub) -> None:
    import io

    from rich.console import Console

    from mlxlaunch.store.progress import RichPullProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    pull(plan_pull(TINY_REPO), progress=RichPullProgress(console, label="tiny"))
    text = out.getvalue()
    assert "tiny" in text
    assert "2.7 MiB/2.7 MiB" in text  # done/total bytes, in the one size format
    assert "0:00:00" in text  # TimeRemainingColumn (ETA) at the end
