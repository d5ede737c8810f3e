"""Sizes read one way everywhere (binary units, one formatter), and a hub that cannot be
reached says why in words, without --debug (it said only `ConnectError`)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxlaunch import units
from mlxlaunch.cli.main import main
from mlxlaunch.dash.snapshot import human_bytes
from mlxlaunch.store import memory


def test_one_formatter_in_binary_units() -> None:
    assert memory.format_bytes is units.format_bytes
    for n in (0, 1536, 870_000_000, 17_200_000_000, 24 * 1024**3):
        assert human_bytes(n) == units.format_bytes(n)
    assert units.format_bytes(24 * 1024**3) == "24.0 GiB"
    assert units.format_bytes(870_000_000) == "829.7 MiB"
    assert units.format_rate(1024**2) == "1.0 MiB/s"


def test_what_the_cli_prints_uses_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "catalog"]) == 0
    assert main(["models", "recommend", "--memory", "19", "--compute", "metal"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "GiB" in text and " GB" not in text and " MB" not in text
    assert "of 14.2 GiB usable (19.0 GiB total)" in text  # --memory 19 reads back as 19


HubAt = Callable[[str], None]


@pytest.fixture
def hub_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubAt:
    """Pulls go to the hub at the URL given (into an empty cache)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return lambda url: monkeypatch.setenv("HF_ENDPOINT", url)


def _pull_error(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["models", "pull", "qwen3-4b"]) == 5
    return " ".join(capsys.readouterr().err.split())


def test_a_name_that_does_not_resolve_is_said(
    hub_at: HubAt, capsys: pytest.CaptureFixture[str]
) -> None:
    hub_at("http://no-such-host.invalid")
    err = _pull_error(capsys)
    assert "'no-such-host.invalid' does not resolve (DNS:" in err, err
    assert "Traceback" not in err


def test_nothing_listening_is_said(hub_at: HubAt, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    hub_at(f"http://127.0.0.1:{port}")
    err = _pull_error(capsys)
    assert f"cannot reach the hub at http://127.0.0.1:{port}: the connection was refused" in err
