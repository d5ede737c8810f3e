"""`mlx doctor --hosts`: a line per host, the shard plan and the measured link, in-process.

The link is measured for real: two ranks started by `mlx.launch` on 127.0.0.1 (ring backend);
an unreachable host is this machine behind a fake `ssh` that exits 255, as ssh does.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import mlx_lm.utils  # noqa: F401  (sets TRANSFORMERS_NO_ADVISORY_WARNINGS once, on import)
import pytest

from mlxlaunch.cli.main import main
from mlxlaunch.testing import ensure_test_model

UNREACHABLE_SSH = """#!/bin/bash
echo "ssh: connect to host $6 port 22: No route to host" >&2
exit 255
"""


def link_ranks_running() -> list[str]:
    """Command lines of live link-measuring ranks (ps: Linux and macOS)."""
    listing = subprocess.run(
        ["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [
        line
        for line in listing.splitlines()
        if "mlxlaunch.cluster.link" in line and not line.lstrip().startswith("Z")
    ]


@pytest.fixture(autouse=True)
def no_rank_left_behind() -> Iterator[None]:
    yield
    assert link_ranks_running() == [], "a link rank outlived its test"


def _doctor(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """`mlx doctor ARGV` in-process on a wide console: exit code, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "250")
    code = main(["doctor", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _line(out: str, start: str) -> str:
    (found,) = [line for line in out.splitlines() if start in line]
    return found


@pytest.mark.slow
def test_doctor_hosts_reports_each_host_the_plan_and_the_link(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_test_model("tiny-moe")
    _, out, _ = _doctor(
        ["--hosts", "127.0.0.1,127.0.0.1", "--model", "tiny-moe"], monkeypatch, capsys
    )
    assert "mlx doctor: cluster" in out
    host = _line(out, "host 127.0.0.1")
    assert " ok " in f" {host} " and "ranks 0,1" in host and "ring: yes" in host
    assert "mlx 0.32" in host and "model: 3.0 MiB" in host and "free" in host
    assert " ok " in f" {_line(out, 'versions')} "
    plan = _line(out, "shard plan")
    assert "tensor parallel over 2 ranks" in plan
    link = _line(out, "│ link")
    assert " ok " in link and "µs" in link and "GB/s" in link


@pytest.mark.slow
def test_doctor_hosts_json_carries_the_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_test_model("tiny-moe")
    argv = ["--hosts", "127.0.0.1,127.0.0.1", "--model", "tiny-moe", "--parallel", "pipeline"]
    _, out, _ = _doctor([*argv, "--json"], monkeypatch, capsys)
    cluster = json.loads(out)["cluster"]
    assert cluster["status"] == "ok" and cluster["problems"] == []
    assert cluster["plan"]["parallel"] == "pipeline" and cluster["plan"]["layers"] == [
        [2, 4],
        [0, 2],
    ]
    assert cluster["link"]["error"] is None and cluster["link"]["latency_us"] > 0
    assert cluster["link"]["bus_gb_s"] > 0
    (host,) = cluster["hosts"]
    assert host["reachable"] and host["model"]["found"]


@pytest.mark.slow
def test_an_unreachable_host_is_reported_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_test_model("tiny-moe")
    ssh = tmp_path / "ssh"
    ssh.write_text(UNREACHABLE_SSH, encoding="utf-8")
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    code, out, _ = _doctor(
        ["--hosts", "127.0.0.1,10.0.0.9", "--model", "tiny-moe"], monkeypatch, capsys
    )
    assert code == 1
    host = _line(out, "host 10.0.0.9")
    assert "FAIL" in host and "unreachable" in host and "No route to host" in host
    assert " ok " in f" {_line(out, 'host 127.0.0.1')} "
    assert "not measured" in _line(out, "│ link")


@pytest.mark.quick
def test_model_without_hosts_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _doctor(["--model", "tiny-moe"], monkeypatch, capsys)
    assert code == 2
    assert "--model needs --hosts" in err
