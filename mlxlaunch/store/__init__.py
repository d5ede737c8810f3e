"""store room of mlxlaunch (see DESIGN.md): the local model store on the Hugging Face hub cache.

Pull (`plan_pull` + `pull`), inventory (`list_models`), removal (`plan_removal` +
`execute_removal`), the alias catalog (`CATALOG`, `recommend`), model facts read from files
(`read_facts`), and `resolve_model`, which every other room uses to find a model locally.

The names below are imported on first use, not with the package: `import mlxlaunch.store.x`
runs this file first, and the hub client behind `pull` costs ~0.3 s that `mlx --help`, the
shell completion of model names and the engine's imports of `store.dialects` must not pay.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxlaunch.store.catalog import (
        CATALOG,
        CatalogEntry,
        alias_for_repo,
        catalog_entry,
        recommend,
    )
    from mlxlaunch.store.facts import ModelFacts, read_facts
    from mlxlaunch.store.inventory import LocalModel, find_local, list_models, snapshot_complete
    from mlxlaunch.store.memory import MemoryFit, memory_fit, system_memory_bytes
    from mlxlaunch.store.pull import NotAnMlxModel, PullPlan, PullResult, plan_pull, pull
    from mlxlaunch.store.registry import mark_used, register_local
    from mlxlaunch.store.remove import ModelInUse, Removal, execute_removal, plan_removal
    from mlxlaunch.store.resolve import ResolvedModel, resolve_model
    from mlxlaunch.store.running import RunningServer, running_servers
    from mlxlaunch.store.verify import VerifyReport, verify_model_dir

# Each public name and the module that defines it.
_HOMES = {
    "catalog": ("CATALOG", "CatalogEntry", "alias_for_repo", "catalog_entry", "recommend"),
    "facts": ("ModelFacts", "read_facts"),
    "inventory": ("LocalModel", "find_local", "list_models", "snapshot_complete"),
    "memory": ("MemoryFit", "memory_fit", "system_memory_bytes"),
    "pull": ("NotAnMlxModel", "PullPlan", "PullResult", "plan_pull", "pull"),
    "registry": ("mark_used", "register_local"),
    "remove": ("ModelInUse", "Removal", "execute_removal", "plan_removal"),
    "resolve": ("ResolvedModel", "resolve_model"),
    "running": ("RunningServer", "running_servers"),
    "verify": ("VerifyReport", "verify_model_dir"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

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


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _StorePackage(types.ModuleType):
    """The package, whose public names win over submodules of the same name (`pull`).

    Importing `mlxlaunch.store.pull` binds the submodule to the package's `pull` attribute;
    the eager package this replaces rebound it to the function right after, and so does this.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _MODULE_OF and isinstance(value, types.ModuleType):
            return  # the name keeps (or, once asked for, gets) its meaning above
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _StorePackage
