"""The alias catalog and `recommend` for injected memory sizes."""

from __future__ import annotations

import re

import pytest

from mlxlaunch.store import CATALOG, alias_for_repo, catalog_entry, recommend
from mlxlaunch.store.catalog import CatalogEntry
from mlxlaunch.store.compute import Compute, active_share, this_machine
from mlxlaunch.store.memory import GIB, memory_fit, memory_needed

REPO_SHAPE = re.compile(r"^mlx-community/[A-Za-z0-9][A-Za-z0-9._-]+$")


def test_catalog_entries_are_valid() -> None:
    aliases = [e.alias for e in CATALOG]
    assert len(aliases) == len(set(aliases))
    assert len({e.repo_id for e in CATALOG}) == len(CATALOG)
    for e in CATALOG:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", e.alias), e.alias
        assert "/" not in e.alias  # an alias must never be mistaken for a repo id
        assert REPO_SHAPE.match(e.repo_id), e.repo_id
        assert f"{e.bits}bit" in e.repo_id, e  # the repo name states its quantisation
        assert e.kind in ("coder", "general", "vision")
        assert 0.5e9 < e.size_bytes < 200e9
        assert e.context_window >= 32_768  # Claude Code's prompt alone is ~20k tokens
        assert e.memory_bytes > e.size_bytes
        assert catalog_entry(e.alias.upper()) == e
        assert alias_for_repo(e.repo_id.lower()) == e.alias


def test_app_help_alias_exists() -> None:
    assert catalog_entry("qwen-coder-7b") is not None  # used in `mlx --help` examples


@pytest.mark.parametrize("gib", [4, 8, 16, 24, 32, 48, 64, 128, 512])
def test_recommend_picks_the_best_entry_that_fits(gib: int) -> None:
    total = gib * GIB
    pick = recommend(total)
    fitting = [e for e in CATALOG if memory_fit(e.size_bytes, total).fits]
    assert pick is not None and pick in fitting
    assert pick.rank == max(e.rank for e in fitting)


def test_recommend_known_machines() -> None:
    assert recommend(1 * GIB) is None
    assert recommend(4 * GIB) == catalog_entry("qwen-coder-1.5b")
    assert recommend(8 * GIB) == catalog_entry("qwen3-4b")
    assert recommend(32 * GIB) == catalog_entry("qwen3-coder-30b")
    assert recommend(64 * GIB) == catalog_entry("qwen3-coder-30b-8bit")
    assert recommend(32 * GIB, kind="general") == catalog_entry("qwen3-30b")


def test_recommend_breaks_rank_ties_by_context() -> None:
    short = CatalogEntry("a", "mlx-community/A-4bit", "coder", "7B", 4, 10**9, 32_768, 50)
    long = CatalogEntry("b", "mlx-community/B-4bit", "coder", "7B", 4, 10**9, 131_072, 50)
    assert recommend(64 * GIB, entries=[short, long]) == long


def test_memory_estimate_grows_with_weights() -> None:
    assert memory_needed(0) > 0
    assert memory_needed(10 * GIB) > 10 * GIB
    assert not memory_fit(100 * GIB, 64 * GIB).fits
    assert memory_fit(100 * GIB, 0).fits  # unknown machine: do not block


def test_mixtures_of_experts_read_their_active_share() -> None:
    assert active_share("30B-A3B") == pytest.approx(0.1)
    assert active_share("7B") == 1.0
    coder = catalog_entry("qwen3-coder-30b")
    assert coder is not None and coder.active_bytes == int(coder.size_bytes * 0.1)


def test_a_cpu_only_machine_gets_a_model_it_can_run() -> None:
    # The machine of the report: 2 cores, 24 GiB, no GPU. Memory alone picks an 8.3 GB model;
    # generating with it on two cores would take minutes per reply.
    two_cores = Compute("cpu", 2)
    by_memory = recommend(24 * GIB)
    assert by_memory is not None and by_memory.size_bytes > 8 * 1000**3
    pick = recommend(24 * GIB, compute=two_cores)
    assert pick == catalog_entry("qwen-coder-1.5b")
    assert pick is not None and pick.active_bytes <= (two_cores.active_bytes_budget or 0)
    # More cores, bigger models; a GPU is judged by memory alone.
    assert recommend(64 * GIB, compute=Compute("cpu", 16)) == catalog_entry("qwen3-coder-30b-8bit")
    assert recommend(24 * GIB, compute=Compute("metal", 8)) == by_memory
    assert recommend(24 * GIB, compute=Compute("cuda", 8)) == by_memory


def test_when_nothing_suits_the_fastest_model_that_fits_is_picked() -> None:
    one_core = Compute("cpu", 1)  # a 0.5 GB budget: no catalog model is that small
    assert recommend(8 * GIB, compute=one_core) == catalog_entry("qwen-coder-1.5b")
    assert recommend(1 * GIB, compute=one_core) is None  # nothing fits in memory at all


def test_this_machine_names_a_backend() -> None:
    here = this_machine()
    assert here.backend in ("metal", "cuda", "cpu") and here.cores >= 1
    assert Compute("cpu", 2).describe() == "CPU only (2 cores)"


def test_this_machines_recommendation_weighs_its_compute() -> None:
    here = this_machine()
    assert recommend() == recommend(memory_fit(0).total, compute=here)


def test_vision_models_are_suggested_only_when_asked_for() -> None:
    from mlxlaunch.store.catalog import vision_pick

    vision = [e for e in CATALOG if e.kind == "vision"]
    assert vision, "the catalog names a vision model for text-only models' refusals"
    for memory in (8, 16, 64, 512):
        picked = recommend(memory * 1024**3)
        assert picked is not None and picked.kind != "vision"
        assert recommend(memory * 1024**3, kind="vision") in vision
    assert vision_pick(1024**3) == min(vision, key=lambda e: e.size_bytes)  # none fits
    assert vision_pick(64 * 1024**3).kind == "vision"
