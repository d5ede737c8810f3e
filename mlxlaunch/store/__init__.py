"""store room of mlxlaunch (see DESIGN.md): the local model store on the Hugging Face hub cache.

Pull (`plan_pull` + `pull`), inventory (`list_models`), removal (`plan_removal` +
`execute_removal`), the alias catalog (`CATALOG`, `recommend`), model facts read from files
(`read_facts`), and `resolve_model`, which every other room uses to find a model locally.
"""

from __future__ import annotations

from mlxlaunch.store.catalog import CATALOG, CatalogEntry, alias_for_repo, catalog_entry, recommend
from mlxlaunch.store.facts import ModelFacts, read_facts
from mlxlaunch.store.inventory import LocalModel, find_local, list_models, snapshot_complete
from mlxlaunch.store.memory import MemoryFit, memory_fit, system_memory_bytes
from mlxlaunch.store.pull import NotAnMlxModel, PullPlan, PullResult, plan_pull, pull
from mlxlaunch.store.registry import mark_used, register_local
from mlxlaunch.store.remove import ModelInUse, Removal, execute_removal, plan_removal
from mlxlaunch.store.resolve import ResolvedModel, resolve_model
from mlxlaunch.store.running import RunningServer, running_servers
from mlxlaunch.store.verify import VerifyReport, verify_model_dir

__all__ = [
    "CATALOG",
    "CatalogEntry",
    "LocalModel",
    "MemoryFit",
    "ModelFacts",
    "ModelInUse",
    "NotAnMlxModel",
    "PullPlan",
    "PullResult",
    "Removal",
    "ResolvedModel",
    "RunningServer",
    "VerifyReport",
    "alias_for_repo",
    "catalog_entry",
    "execute_removal",
    "find_local",
    "list_models",
    "mark_used",
    "memory_fit",
    "plan_pull",
    "plan_removal",
    "pull",
    "read_facts",
    "recommend",
    "register_local",
    "resolve_model",
    "running_servers",
    "snapshot_complete",
    "system_memory_bytes",
    "verify_model_dir",
]
