"""The web search settings: `mlx config set search.*` writes a `[search]` table that reads
back to the dotted names written, the backend they name, and `mlx doctor`'s line on it."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from mlxlaunch import config
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.doctor import DoctorFacts, run_checks
from mlxlaunch.server.search_backends import BRAVE_URL, SearchBackend, configured_backend


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {config.CONFIG_DIR_ENV: str(tmp_path / "cfg")}


def test_dotted_settings_read_back_as_written(env: dict[str, str]) -> None:
    config.set_value("port", "8123", env)
    config.set_value("search.backend", "SearXNG", env)
    config.set_value("search.url", "http://127.0.0.1:8888/", env)
    loaded = config.load_config(env)
    assert loaded.get("search.backend") == "searxng"
    assert loaded.get("search.url") == "http://127.0.0.1:8888"
    assert loaded.get("port") == 8123
    # The file is the TOML a user would write by hand: a [search] table.
    raw = tomllib.loads(config.config_path(env).read_text())
    assert raw == {"port": 8123, "search": {"backend": "searxng", "url": "http://127.0.0.1:8888"}}
    # Changing and removing one keeps the rest.
    config.set_value("search.backend", "brave", env)
    assert config.unset_value("search.url", env) is True
    loaded = config.load_config(env)
    assert loaded.values == {"port": 8123, "search.backend": "brave"}


def test_a_hand_written_search_table_is_read(env: dict[str, str]) -> None:
    path = config.config_path(env)
    path.parent.mkdir(parents=True)
    path.write_text('[search]\nbackend = "brave"\napi-key = "k-123"\n[future]\nx = 1\n')
    config.set_value("default-model", "m", env)  # a write keeps the unknown table
    assert tomllib.loads(path.read_text())["future"] == {"x": 1}
    backend = configured_backend(config.load_config(env), env={})
    assert backend == SearchBackend("brave", BRAVE_URL, api_key="k-123")


@pytest.mark.parametrize(
    ("key", "value"),
    [("search.backend", "google"), ("search.url", "127.0.0.1:8888"), ("search.api-key", " ")],
)
def test_bad_search_values_are_refused(env: dict[str, str], key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        config.set_value(key, value, env)


def test_a_backend_without_what_it_needs_is_a_config_error(env: dict[str, str]) -> None:
    assert configured_backend(config.load_config(env), env={}) is None  # none by default
    config.set_value("search.backend", "searxng", env)
    with pytest.raises(ConfigError, match=r"search\.url"):
        configured_backend(config.load_config(env), env={})
    config.set_value("search.backend", "brave", env)
    with pytest.raises(ConfigError, match="API key"):
        configured_backend(config.load_config(env), env={})
    # The key may come from the environment instead of the file.
    backend = configured_backend(config.load_config(env), env={config.SEARCH_API_KEY_ENV: "e"})
    assert backend is not None and backend.api_key == "e" and backend.url == BRAVE_URL


def test_config_show_masks_the_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxlaunch.cli.main import main

    monkeypatch.setenv(config.CONFIG_DIR_ENV, str(tmp_path / "cfg"))
    assert main(["config", "set", "search.api-key", "secret-key-7890"]) == 0
    capsys.readouterr()
    assert main(["config", "show", "--json"]) == 0
    shown = capsys.readouterr().out
    assert "secret-key" not in shown and "****7890" in shown
    assert main(["config", "get", "search.api-key"]) == 0  # whole, for scripts
    assert capsys.readouterr().out.strip() == "secret-key-7890"


def test_doctor_says_whether_search_is_configured() -> None:
    from test_doctor import HEALTHY

    def check(facts: DoctorFacts) -> tuple[str, str, str | None]:
        found = next(c for c in run_checks(facts) if c.name == "web search")
        return found.status, found.detail, found.fix

    status, detail, fix = check(HEALTHY)
    assert status == "info" and "not configured" in detail
    assert fix is not None and "mlx config set search.backend" in fix
    assert check(replace(HEALTHY, search="searxng at http://h:1"))[:2] == (
        "ok", "searxng at http://h:1"
    )  # fmt: skip
    status, detail, _ = check(replace(HEALTHY, search_problem="no key"))
    assert status == "warn" and detail == "no key"
