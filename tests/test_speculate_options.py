"""`--speculate` and `--draft-model` as the commands take them: refused early where they
cannot run, carried to the engine where they can."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mlxlaunch.cli.main import app
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.serving import EngineOptions


def test_speculate_draft_without_a_draft_model_is_refused_before_loading() -> None:
    with pytest.raises(ConfigError, match="needs a draft model") as refused:
        EngineOptions(speculate="draft").config_arguments()
    assert "--draft-model" in (refused.value.hint or "")
    arguments = EngineOptions(speculate="lookup").config_arguments()
    assert arguments["speculate"] == "lookup"


@pytest.mark.parametrize("mode", ["lookup", "draft"])
def test_a_cluster_refuses_an_explicit_drafter(mode: str) -> None:
    with pytest.raises(ConfigError, match="--hosts"):
        EngineOptions(speculate=mode, draft_model="m").check_for_cluster()
    EngineOptions().check_for_cluster()  # auto: off on a cluster


def test_an_unknown_speculate_mode_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "tiny", "--speculate", "often"])
    assert result.exit_code == 2
    assert "not one of" in result.output


def test_the_cli_spells_the_engines_speculate_modes() -> None:
    import typing

    from mlxlaunch.cli.scheduler_options import SPECULATE_MODES
    from mlxlaunch.engine.config import SPECULATE_MODES as ENGINE_MODES
    from mlxlaunch.engine.config import SpeculateMode

    assert set(typing.get_args(SpeculateMode)) == set(ENGINE_MODES) == set(SPECULATE_MODES)
