"""A hub that stops answering: `mlx models pull` fails within its timeouts, saying so.

Two hubs that hang: `SilentHub` accepts connections and never sends a byte; `FakeHub.stall`
sends a file's headers and part of its body, then nothing. The timeouts are injected (1 s) so
each failure takes seconds; the bounds asserted are generous for a busy machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakehub import TINY_REPO, FakeHub, SilentHub

from mlxlaunch.errors import ConfigError, NetworkError
from mlxlaunch.store import list_models, plan_pull, pull
from mlxlaunch.store.hub_timeouts import HUB_TIMEOUT_ENV, HubTimeout, HubTimeouts

FAST = HubTimeouts(read_s=1.0, connect_s=1.0)
# Far above what 1 s timeouts need, far below "forever" (the bug: still waiting at 180 s).
BOUND_S = 40.0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pull_from_a_hub_that_never_answers_fails_in_seconds_with_the_reason(
    tmp_path: Path,
) -> None:
    with SilentHub() as silent:
        env = {
            **os.environ,
            "HF_ENDPOINT": silent.url,
            "HF_HUB_CACHE": str(tmp_path / "hub"),
            "MLXLAUNCH_HOME": str(tmp_path / "home"),
            HUB_TIMEOUT_ENV: "1",
        }
        env.pop("HF_HUB_OFFLINE", None)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "mlxlaunch", "models", "pull", TINY_REPO],
            capture_output=True,
            text=True,
            env=env,
            timeout=BOUND_S + 30,  # interpreter start-up on a busy machine on top
        )
        elapsed = time.monotonic() - started
        assert silent.connections >= 1  # it did reach the hub, which kept silent
    err = " ".join(done.stderr.split())
    assert done.returncode == NetworkError.exit_code, done.stderr
    assert f"the hub at {silent.url} did not answer within 1 s" in err
    assert HUB_TIMEOUT_ENV in err  # how to allow longer
    assert "again" in err  # how to retry
    assert "Traceback" not in done.stderr
    assert elapsed < BOUND_S


@pytest.mark.timeout(60)
def test_plan_against_a_silent_hub_is_a_typed_timeout(hub_cache: Path) -> None:
    with SilentHub() as silent:
        started = time.monotonic()
        with pytest.raises(HubTimeout) as stalled:
            plan_pull(TINY_REPO, endpoint=silent.url, timeouts=FAST)
        elapsed = time.monotonic() - started
    assert stalled.value.seconds == 1.0 and stalled.value.phase == "read"
    assert stalled.value.endpoint == silent.url
    assert "/api/models/test-org/tiny-mlx" in (stalled.value.target or "")
    assert elapsed < BOUND_S


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_download_that_stalls_mid_body_times_out_and_the_next_pull_resumes(
    hub: FakeHub, hub_cache: Path
) -> None:
    plan = plan_pull(TINY_REPO, timeouts=FAST)
    hub.stall("model.safetensors", after_bytes=300_000)
    started = time.monotonic()
    with pytest.raises(HubTimeout, match=r"did not answer within 1 s \(model\.safetensors\)"):
        pull(plan, timeouts=FAST)
    assert time.monotonic() - started < BOUND_S
    # One retry resumed after the bytes that came; it got nothing, so no more tries wait.
    assert hub.gets_of("model.safetensors") == [None, "bytes=300000-"]
    assert list_models() == []  # nothing half-registered
    [partial] = hub_cache.glob("*/blobs/*.incomplete")
    assert partial.stat().st_size == 300_000

    hub.unstall()
    result = pull(plan, timeouts=FAST)
    assert hub.gets_of("model.safetensors")[-1] == "bytes=300000-"
    assert result.report.ok, result.report.problems
    assert [m.repo_id for m in list_models()] == [TINY_REPO]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_mlx_models_pull_reports_a_stalled_download(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    monkeypatch.setenv(HUB_TIMEOUT_ENV, "1")
    hub.stall("model.safetensors", after_bytes=0)
    assert main(["models", "pull", TINY_REPO]) == NetworkError.exit_code
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: the hub at {hub.url} did not answer within 1 s (model.safetensors)" in err
    assert f"{HUB_TIMEOUT_ENV}=120" in err


def test_timeouts_come_from_the_environment() -> None:
    assert HubTimeouts.from_env({}) == HubTimeouts(read_s=30.0, connect_s=10.0)
    assert HubTimeouts.from_env({HUB_TIMEOUT_ENV: "120"}) == HubTimeouts(120.0, 10.0)
    assert HubTimeouts.from_env({HUB_TIMEOUT_ENV: "2.5"}) == HubTimeouts(2.5, 2.5)
    # huggingface_hub's own variable counts when ours is not set.
    assert HubTimeouts.from_env({"HF_HUB_DOWNLOAD_TIMEOUT": "60"}).read_s == 60.0
    both = {HUB_TIMEOUT_ENV: "5", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}
    assert HubTimeouts.from_env(both).read_s == 5.0
    timeout = HubTimeouts(120.0, 10.0).httpx()
    assert (timeout.connect, timeout.read) == (10.0, 120.0)


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_bad_timeout_setting_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match=HUB_TIMEOUT_ENV):
        HubTimeouts.from_env({HUB_TIMEOUT_ENV: value})
