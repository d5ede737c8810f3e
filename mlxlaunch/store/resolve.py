"""Turn what a user types for `--model` into a local directory — never downloading.

One resolver for the server, `mlx launch claude` and `mlx models`: a model pulled once is found
everywhere. Downloads happen only through `mlx models pull`, on the user's request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlxlaunch.errors import ModelNotFound
from mlxlaunch.store.catalog import alias_for_repo, catalog_entry
from mlxlaunch.store.errors import ModelNotDownloaded, UnknownModel
from mlxlaunch.store.inventory import shard_held, snapshot_complete
from mlxlaunch.store.paths import hub_cache_dir
from mlxlaunch.store.registry import local_models, mark_used

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name led: the directory to load and how it was found.

    `source` is "path" (a directory given directly), "local" (a name registered with
    `mlx models add`), "alias" (a catalog alias) or "repo" (a hub repo id in the cache).
    """

    path: Path
    repo_id: str | None
    alias: str | None
    source: str

    @property
    def key(self) -> str:
        """The name `last used` is recorded under."""
        return self.repo_id or str(self.path)


def is_repo_id(name: str) -> bool:
    """True when `name` has the `org/name` shape of a hub repo id."""
    return bool(REPO_ID.match(name)) and not name.startswith((".", "/", "~"))


def repo_folder(repo_id: str, cache_dir: Path) -> Path | None:
    """The cache folder of `repo_id` (hub ids are case-insensitive; folders keep the case)."""
    exact = cache_dir / ("models--" + repo_id.replace("/", "--"))
    if exact.is_dir():
        return exact
    wanted = exact.name.lower()
    if cache_dir.is_dir():
        for child in cache_dir.iterdir():
            if child.name.lower() == wanted and child.is_dir():
                return child
    return None


def cached_snapshot(repo_id: str, cache_dir: Path, revision: str = "main") -> Path | None:
    """The snapshot directory for `repo_id` at `revision` in the cache, or None."""
    folder = repo_folder(repo_id, cache_dir)
    if folder is None:
        return None
    commit = revision if COMMIT.match(revision) else None
    ref = folder / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    if commit is not None:
        snap = folder / "snapshots" / commit
        return snap if snap.is_dir() else None
    snapshots = [p for p in (folder / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def _from_hub(
    repo_id: str, alias: str | None, asked: str, cache_dir: Path, shard_ok: bool = False
) -> ResolvedModel:
    snapshot = cached_snapshot(repo_id, cache_dir)
    if snapshot is None:
        raise ModelNotDownloaded(asked)
    # A shard pull (`mlx models pull --shard`) holds what this host's ranks load: enough for
    # a cluster's rank, never for serving alone.
    if not snapshot_complete(snapshot) and not (shard_ok and shard_held(snapshot)):
        raise ModelNotDownloaded(asked, partly=True)
    return ResolvedModel(snapshot, repo_id, alias, "alias" if alias == asked else "repo")


def resolve_model(
    name: str, *, cache_dir: Path | None = None, record_use: bool = False, shard_ok: bool = False
) -> ResolvedModel:
    """Find the local directory for `name`: a path, registered name, alias or cached repo id.

    Args:
        name: what the user typed for `--model`.
        cache_dir: the hub cache (default: HF_HUB_CACHE / HF_HOME rules).
        record_use: record "last used" for `mlx models list`.
        shard_ok: a shard-only pull will do (a cluster's rank loads only its shard).

    Raises:
        ModelNotFound: nothing local matches (ModelNotDownloaded: an alias or repo id that a
            pull would bring; UnknownModel: none of those).
    """
    cache = cache_dir or hub_cache_dir()
    resolved = _resolve(name.strip(), cache, shard_ok)
    if record_use:
        mark_used(resolved.key)
    return resolved


def _resolve(name: str, cache: Path, shard_ok: bool = False) -> ResolvedModel:
    path = Path(name).expanduser()
    looks_like_path = name.startswith((".", "/", "~")) or (path.is_dir() and not is_repo_id(name))
    if looks_like_path:
        if not (path / "config.json").is_file():
            raise ModelNotFound(
                f"'{name}' is not a model directory (no config.json)",
                hint="give a directory with config.json and *.safetensors, an alias, or org/repo",
            )
        return ResolvedModel(path.resolve(), None, None, "path")
    registered = local_models()
    if name in registered:
        return ResolvedModel(registered[name], None, None, "local")
    if (entry := catalog_entry(name)) is not None:
        return _from_hub(entry.repo_id, entry.alias, name, cache, shard_ok)
    if is_repo_id(name):
        return _from_hub(name, alias_for_repo(name), name, cache, shard_ok)
    raise UnknownModel(name)
