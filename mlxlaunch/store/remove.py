"""`mlx models rm`: free a model's files — unless a running server has it loaded."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir

from mlxlaunch.errors import ModelNotFound
from mlxlaunch.store.errors import ModelInUse, NotLocal
from mlxlaunch.store.inventory import LocalModel, find_local
from mlxlaunch.store.paths import hub_cache_dir
from mlxlaunch.store.pull import to_repo_id
from mlxlaunch.store.registry import unregister_local
from mlxlaunch.store.resolve import repo_folder
from mlxlaunch.store.running import RunningServer, servers_using


@dataclass(frozen=True)
class Removal:
    """What `rm` will delete, for the confirmation prompt."""

    name: str
    target: Path  # the repo folder in the cache, or the registered directory
    freed_bytes: int
    model: LocalModel | None  # None for a pull that never finished
    cache_dir: Path

    @property
    def deletes_files(self) -> bool:
        """False for registered local directories: rm only forgets them."""
        return self.model is None or self.model.source == "hub"


def _folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def plan_removal(name: str, *, cache_dir: Path | None = None, home: Path | None = None) -> Removal:
    """Find what `name` would free, refusing when a running server uses it.

    Raises:
        ModelNotFound: nothing local by that name.
        ModelInUse: a live server (per its state record) has it loaded.
    """
    cache = cache_dir or hub_cache_dir()
    model = find_local(name, cache)
    if model is not None:
        target = model.path if model.source == "local" else model.path.parent.parent
        _refuse_if_used(name, target, home)
        freed = model.size_on_disk if model.source == "hub" else 0
        return Removal(model.name, target, freed, model, cache)
    # A pull that never finished is invisible to `list` but still holds bytes.
    try:
        repo_id, _ = to_repo_id(name)
    except ModelNotFound:
        repo_id = ""
    folder = repo_folder(repo_id, cache) if repo_id else None
    if folder is None:
        raise NotLocal(name)
    _refuse_if_used(name, folder, home)
    return Removal(repo_id, folder, _folder_size(folder), None, cache)


def _refuse_if_used(name: str, target: Path, home: Path | None) -> None:
    users: list[RunningServer] = servers_using(target, home)
    if users:
        s = users[0]
        raise ModelInUse(name, s.url, s.pid)


def execute_removal(removal: Removal) -> int:
    """Delete (or, for registered directories, forget) the model; returns bytes freed."""
    model = removal.model
    if model is not None and model.source == "local":
        unregister_local(model.name)
        return 0
    if model is not None and model.revisions:
        strategy = scan_cache_dir(removal.cache_dir).delete_revisions(*model.revisions)
        strategy.execute()
    # Partial downloads (and anything delete_revisions kept) go with the repo folder.
    if removal.target.exists():
        shutil.rmtree(removal.target)
    return removal.freed_bytes
