"""One recommendation rule and one explanation: `mlx models recommend` (with or without
--memory), `mlx doctor`, the demo's hint and the README all name the same model for a machine,
and say why with the same words when compute passed bigger models over."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_doctor import HEALTHY

from mlxlaunch.cli.main import main
from mlxlaunch.launch.doctor import run_checks
from mlxlaunch.launch.models import pull_command
from mlxlaunch.store.catalog import CATALOG, catalog_entry, recommend, recommendation
from mlxlaunch.store.compute import Compute, this_machine
from mlxlaunch.store.memory import GIB, memory_fit

README = Path(__file__).resolve().parents[1] / "README.md"
TWO_CORES = Compute("cpu", 2)


def test_with_memory_given_the_pick_still_runs_on_this_machines_compute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `--memory 19` on a CPU-only machine picked a 14B model by memory alone.
    here = this_machine()
    assert main(["models", "recommend", "--memory", "19"]) == 0
    out, err = capsys.readouterr()
    expected = recommendation(19 * GIB, compute=here)
    assert expected is not None and out.split("\t")[0] == expected.entry.alias
    fitting = [e for e in CATALOG if memory_fit(e.size_bytes, 19 * GIB).fits]
    assert expected.entry.suits(here) or not any(e.suits(here) for e in fitting)
    rule = expected.speed_rule()
    if rule is not None:  # a CPU-only machine: the rule is said, in its one wording
        assert f"speed: {rule}" in " ".join(err.split())


def test_two_cores_with_19_gib_get_the_small_coder_and_the_reason() -> None:
    found = recommendation(19 * GIB, compute=TWO_CORES)
    assert found is not None and found.entry.alias == "qwen-coder-1.5b"
    assert recommend(19 * GIB) == catalog_entry("qwen3-14b")  # memory alone: what it was
    rule = found.speed_rule()
    assert rule is not None and rule.startswith("CPU only (2 cores): a model is usable when")
    assert "qwen3-14b" in rule and "minutes per reply" in rule
    metal = recommendation(19 * GIB, compute=Compute("metal", 8))
    assert metal is not None and metal.speed_rule() is None  # nothing passed over: no reason


def test_doctor_says_the_rule_in_the_same_words() -> None:
    facts = replace(HEALTHY, system="Linux", machine="x86_64", device="cpu", cpu_count=2)
    facts = replace(facts, total_memory=24 * GIB, models=())
    memory = next(c for c in run_checks(facts) if c.name == "memory")
    found = recommendation(24 * GIB, compute=TWO_CORES)
    assert found is not None and found.speed_rule() is not None
    assert f"recommended model: {found.entry.alias}" in memory.detail
    assert found.speed_rule() in memory.detail  # type: ignore[operator]


def test_the_demo_and_a_launch_without_a_model_hint_what_recommend_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "recommend"]) == 0
    alias = capsys.readouterr().out.split("\t")[0]
    assert pull_command() == f"mlx models pull {alias}"


def test_the_readme_quotes_what_the_tool_recommends() -> None:
    text = README.read_text()
    # "e.g. qwen-coder-1.5b on a 2-core CPU-only machine with 24 GiB, qwen3-coder-30b on a
    # 32 GiB Mac": each claim of this form is what the rule picks for that machine.
    claims = re.findall(r"`([\w.-]+)` on (?:a|an|this) ([^,;.)]*?) with (\d+) GiB", text)
    assert claims, "the README names no recommendation to check"
    for alias, machine, gib in claims:
        compute = Compute("metal", 8) if "Mac" in machine else _cpu(machine)
        pick = recommend(int(gib) * GIB, compute=compute)
        assert pick is not None and pick.alias == alias, (alias, machine, gib)
    assert "qwen-coder-7b make run" not in text  # the old suggestion the tool never made
    # And the reason, as the tool prints it for the first machine quoted.
    found = recommendation(24 * GIB, compute=TWO_CORES)
    assert found is not None and f"speed: {found.speed_rule()}" in text


def _cpu(machine: str) -> Compute:
    cores = re.search(r"(\d+)-core", machine)
    assert cores is not None, machine
    return Compute("cpu", int(cores.group(1)))


# --- the small model beside the main one (Claude Code's haiku tier) -----------------------


def test_the_small_model_fits_beside_the_main_one_and_shares_its_family() -> None:
    from mlxlaunch.store.catalog import SMALL_MODEL_MAX_BYTES, small_recommendation

    metal = Compute("metal", 10)
    for alias in ("qwen3-coder-30b", "qwen-coder-14b", "qwen3-8b"):
        main = catalog_entry(alias)
        assert main is not None
        found = small_recommendation(main, 64 * GIB, compute=metal)
        assert found is not None
        small = found.entry
        assert small.size_bytes <= SMALL_MODEL_MAX_BYTES and small.size_bytes < main.size_bytes
        assert small.family == main.family  # one tokenizer: it can draft for the main one too
        both = memory_fit(main.size_bytes + small.size_bytes, 64 * GIB)
        assert found.fit == both and both.fits
    # Both are counted: a machine that holds the 30B alone holds no second model beside it.
    main = catalog_entry("qwen3-coder-30b")
    assert main is not None
    holds_alone = next(m * GIB for m in range(16, 64) if memory_fit(main.size_bytes, m * GIB).fits)
    assert small_recommendation(main, holds_alone, compute=metal) is None


def test_recommend_small_names_the_model_and_what_it_sits_beside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["models", "recommend", "--small", "--beside", "qwen3-coder-30b", "--memory", "64"]
    assert main([*args, "--compute", "metal"]) == 0
    out, err = capsys.readouterr()
    assert out.split("\t")[0] == "qwen3-4b"
    assert "beside qwen3-coder-30b (both counted)" in err
    # A small main model needs no second one; the answer says so instead of naming none.
    assert main(["models", "recommend", "--small", "--beside", "qwen-coder-1.5b"]) != 0
    assert "small model already" in capsys.readouterr().err


def test_doctor_counts_the_small_model_beside_the_main_one() -> None:
    from mlxlaunch.launch.doctor import ModelFact

    models = (ModelFact("qwen3-30b", 17 * GIB), ModelFact("qwen3-4b", 2 * GIB))
    facts = replace(HEALTHY, models=models, default_model="qwen3-30b", small_model="qwen3-4b")
    check = {c.name: c for c in run_checks(facts)}["haiku tier"]
    assert check.status == "ok" and "qwen3-4b beside qwen3-30b" in check.detail
    tight = replace(facts, total_memory=31 * GIB)  # the 30B alone fits 31 GiB; not both
    assert memory_fit(17 * GIB, 31 * GIB).fits and not memory_fit(19 * GIB, 31 * GIB).fits
    check = {c.name: c for c in run_checks(tight)}["haiku tier"]
    assert check.status == "warn" and check.fix == "mlx models recommend --small"
    missing = replace(facts, small_model="qwen3-0.6b")
    check = {c.name: c for c in run_checks(missing)}["haiku tier"]
    assert check.status == "warn" and check.fix == "mlx models pull qwen3-0.6b"
    assert "haiku tier" not in {c.name for c in run_checks(HEALTHY)}  # not set: no row
