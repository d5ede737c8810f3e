"""`--json` on every command that prints a table or a report, and `mlx models info` in words:
one JSON document on stdout with stable keys; for people, "yes"/"unknown", never `None`/`True`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from local_store import write_store

from mlxlaunch.cli.main import main
from mlxlaunch.launch.models import offline_model_dir
from mlxlaunch.store import CATALOG

CHECK_KEYS = {"name", "status", "detail", "fix"}
CATALOG_KEYS = {"alias", "repo_id", "kind", "params", "bits", "size_bytes", "context_window",
                "memory_bytes", "note"}  # fmt: skip
MODEL_KEYS = {"name", "repo_id", "alias", "source", "path", "revision", "refs", "size_on_disk",
              "complete", "model_type", "architecture_supported", "quant_bits", "dtype",
              "param_count", "context_window", "tool_format", "thinking", "last_used",
              "shard", "vision"}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private hub cache holding local_store's three models."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    write_store(tmp_path / "hub")
    return tmp_path / "hub"


def _json(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> Any:
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)  # one document, nothing else on stdout


def test_doctor_json_is_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"status", "checks"}
    assert {c["name"] for c in report["checks"]} >= {"MLX backend", "memory", "claude", "disk"}
    for check in report["checks"]:
        assert set(check) == CHECK_KEYS and check["status"] in ("ok", "warn", "fail", "info")
    statuses = {c["status"] for c in report["checks"]}
    expected = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
    assert report["status"] == expected


def test_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(["models", "catalog", "--json"], capsys)
    assert [r["alias"] for r in rows] == [e.alias for e in CATALOG]
    assert all(set(r) == CATALOG_KEYS for r in rows)


def test_recommend_json(capsys: pytest.CaptureFixture[str]) -> None:
    pick = _json(["models", "recommend", "--memory", "32", "--compute", "metal", "--json"], capsys)
    figures = {"fits", "memory", "compute", "speed_rule", "pull_command"}
    assert set(pick) == CATALOG_KEYS | figures | {"context_here", "context_here_text"}
    assert set(pick["context_here"]) == {"16", "8", "4"}  # tokens held at each KV precision
    assert pick["compute"] == "Metal GPU" and pick["speed_rule"] is None
    assert pick["alias"] == "qwen3-coder-30b" and pick["fits"] is True
    assert pick["pull_command"] == "mlx models pull qwen3-coder-30b"


def test_list_json_and_names(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(["models", "list", "--json"], capsys)
    assert all(set(r) == MODEL_KEYS for r in rows)
    by_name = {r["name"]: r for r in rows}
    assert by_name["qwen3-4b"]["param_count"] == 4_000_000_000
    assert by_name["test-org/Llama-Finetune-bf16"]["complete"] is False
    assert main(["models", "list", "--names"]) == 0
    assert capsys.readouterr().out.split() == sorted(by_name, key=str.lower)


def test_info_json(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = _json(["models", "info", "qwen3-4b", "--json"], capsys)
    assert set(info) >= MODEL_KEYS | {"test_model", "problems", "template_features", "files"}
    assert info["test_model"] is False and info["thinking"] is True and info["vision"] is False
    assert "tools" in info["template_features"] and "config.json" in info["files"]


def test_info_speaks_words_not_python(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "info", "test-org/Llama-Finetune-bf16"]) == 0
    out = capsys.readouterr().out
    for raw in ("None", "True", "False", "[]"):
        assert raw not in out.split(), raw
    lines = {line.split(maxsplit=1)[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert lines["complete"].split()[-1] == "no"
    assert lines["thinking"].split()[-1] == "no"
    assert "none found" in lines["tool"]
    assert "no tokenizer files" in lines["problems"]


def test_info_on_a_test_model_not_built_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["models", "info", "demo"]) == 0
    captured = capsys.readouterr()
    assert "test model" in captured.out and "built offline" in captured.out
    assert "not yet" in captured.out
    assert "pull demo" not in captured.out + captured.err
    info = _json(["models", "info", "demo", "--json"], capsys)
    assert info["test_model"] is True and info["built"] is False
    assert not (tmp_path / "test-models").exists()  # info never builds one


@pytest.mark.slow
def test_info_on_a_built_test_model_shows_its_facts(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert offline_model_dir("tiny") == tiny_model_dir  # the layout ensure_test_model builds
    monkeypatch.setenv("COLUMNS", "80")
    info = _json(["models", "info", "tiny", "--json"], capsys)
    assert info["test_model"] is True and info["built"] is True
    assert info["path"] == str(tiny_model_dir) and info["model_type"] == "qwen3"
    assert main(["models", "info", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "test model" in out and "qwen3" in out and "mlx models pull" not in out


def test_not_found_hints_pull_only_for_pullable_names(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "info", "qwen3-8b"]) == 3  # a catalog alias, not downloaded
    assert "mlx models pull qwen3-8b" in capsys.readouterr().err
    assert main(["models", "info", "my-typo"]) == 3
    err = capsys.readouterr().err
    assert "pull" not in err and "mlx models list" in err
