"""The local model inventory: hub-cache repos (via `scan_cache_dir`) plus registered directories.

A directory that a shard pull filled (`mlx models pull --shard`, `--hosts`) holds only some
pipeline ranks' weights: it is not complete (one process cannot serve it), but it is not broken
either, and `shard` says which ranks it holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxlaunch.store.catalog import alias_for_repo
from mlxlaunch.store.facts import ModelFacts, read_config, read_facts, weight_files
from mlxlaunch.store.paths import hub_cache_dir
from mlxlaunch.store.registry import last_used, local_models
from mlxlaunch.store.shards import read_marker

if TYPE_CHECKING:  # the hub client is imported where the cache is scanned (~0.15 s)
    from huggingface_hub import CachedRepoInfo, CachedRevisionInfo


@dataclass(frozen=True)
class LocalModel:
    """One model on this machine, as `mlx models list` shows it."""

    name: str  # what to type: alias, repo id, or registered name
    repo_id: str | None
    alias: str | None
    source: str  # "hub" (hub cache) or "local" (registered directory)
    path: Path  # the directory mlx-lm loads
    revision: str | None  # commit hash for hub models
    refs: tuple[str, ...]
    size_on_disk: int
    complete: bool
    facts: ModelFacts
    last_used: float | None
    revisions: tuple[str, ...] = ()
    shard: str | None = None  # "1/2": only these pipeline ranks' files, all present

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict for `--json` output."""
        f = self.facts
        return {
            "name": self.name,
            "repo_id": self.repo_id,
            "alias": self.alias,
            "source": self.source,
            "path": str(self.path),
            "revision": self.revision,
            "refs": list(self.refs),
            "size_on_disk": self.size_on_disk,
            "complete": self.complete,
            "shard": self.shard,
            "model_type": f.model_type,
            "architecture_supported": f.architecture_supported,
            "quant_bits": f.quant_bits,
            "dtype": f.dtype,
            "param_count": f.param_count,
            "context_window": f.context_window,
            "tool_format": f.tool_format,
            "thinking": f.thinking,
            "vision": f.vision,
            "last_used": self.last_used,
        }


def _has_tokenizer(path: Path) -> bool:
    tokenizers = ("tokenizer.json", "tokenizer.model", "vocab.json")
    return any((path / n).is_file() for n in tokenizers) or any(path.glob("*.tiktoken"))


def shard_held(path: Path) -> str | None:
    """The ranks label ("1/2") of a shard pull's directory holding every file those ranks
    load; None for a directory without a shard marker, or with files missing."""
    marker = read_marker(path)
    if marker is None or not (path / "config.json").is_file() or not _has_tokenizer(path):
        return None
    if not marker.weight_files or not all((path / f).is_file() for f in marker.weight_files):
        return None
    return marker.spec.label


def snapshot_complete(path: Path) -> bool:
    """True when a model directory holds everything mlx-lm loads (no missing shards)."""
    if not (path / "config.json").is_file():
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = set(weight_map.values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        if not shards or not all((path / s).is_file() for s in shards):
            return False
    elif not any(p.is_file() for p in path.glob("model*.safetensors")):
        return False
    return _has_tokenizer(path)


def _shard_of(path: Path, complete: bool) -> str | None:
    return None if complete else shard_held(path)


def _main_revision(repo: CachedRepoInfo) -> CachedRevisionInfo:
    """The revision `main` points to, else the newest one."""
    by_ref = {ref: rev for rev in repo.revisions for ref in rev.refs}
    if "main" in by_ref:
        return by_ref["main"]
    return max(repo.revisions, key=lambda r: r.last_modified)


def _is_model(snapshot: Path) -> bool:
    """False for a repo no one could load as a model (e.g. a lone tokenizer repo)."""
    return isinstance(read_config(snapshot).get("model_type"), str) or bool(weight_files(snapshot))


def _hub_models(cache_dir: Path, used: dict[str, float]) -> list[LocalModel]:
    if not cache_dir.is_dir():
        return []
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache_dir)
    models = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = _main_revision(repo)
        if not _is_model(revision.snapshot_path):
            continue
        facts = read_facts(revision.snapshot_path)
        alias = alias_for_repo(repo.repo_id)
        complete = snapshot_complete(revision.snapshot_path)
        models.append(
            LocalModel(
                name=alias or repo.repo_id,
                repo_id=repo.repo_id,
                alias=alias,
                source="hub",
                path=revision.snapshot_path,
                revision=revision.commit_hash,
                refs=tuple(sorted(revision.refs)),
                size_on_disk=repo.size_on_disk,
                complete=complete,
                facts=facts,
                last_used=used.get(repo.repo_id),
                revisions=tuple(sorted(r.commit_hash for r in repo.revisions)),
                shard=_shard_of(revision.snapshot_path, complete),
            )
        )
    return models


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _local_models(used: dict[str, float]) -> list[LocalModel]:
    models = []
    for name, path in local_models().items():
        if not path.is_dir():
            continue  # registered, then moved or deleted: `mlx models rm NAME` forgets it
        complete = snapshot_complete(path)
        models.append(
            LocalModel(
                name=name,
                repo_id=None,
                alias=None,
                source="local",
                path=path,
                revision=None,
                refs=(),
                size_on_disk=_dir_size(path),
                complete=complete,
                facts=read_facts(path),
                last_used=used.get(name),
                shard=_shard_of(path, complete),
            )
        )
    return models


# The hub cache's layout (huggingface_hub's, documented and stable): models--ORG--NAME/
# refs/main holds the commit that snapshots/COMMIT/ is the tree of.
_HUB_MODEL_PREFIX = "models--"


def _hub_names(cache_dir: Path) -> list[str]:
    """The names `_hub_models` lists, read from the cache's layout without the hub client."""
    names = []
    for repo in cache_dir.glob(_HUB_MODEL_PREFIX + "*") if cache_dir.is_dir() else ():
        snapshots = [p for p in (repo / "snapshots").glob("*") if p.is_dir()]
        if not snapshots:
            continue
        try:
            main = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            main = ""
        by_commit = {p.name: p for p in snapshots}
        snapshot = by_commit.get(main) or max(snapshots, key=lambda p: p.stat().st_mtime)
        if _is_model(snapshot):
            repo_id = repo.name.removeprefix(_HUB_MODEL_PREFIX).replace("--", "/")
            names.append(alias_for_repo(repo_id) or repo_id)
    return names


def local_model_names(cache_dir: Path | None = None) -> list[str]:
    """The names of `list_models()`, in its order, without reading weights or the hub client.

    What shell completion asks for on every TAB (`mlx models list --names`): milliseconds, where
    a full listing reads every model's headers and imports huggingface_hub (~0.15 s).
    """
    registered = [name for name, path in local_models().items() if path.is_dir()]
    return sorted(_hub_names(cache_dir or hub_cache_dir()) + registered, key=str.lower)


def list_models(cache_dir: Path | None = None) -> list[LocalModel]:
    """Every local model: hub-cache repos and registered directories, sorted by name."""
    used = last_used()
    models = _hub_models(cache_dir or hub_cache_dir(), used) + _local_models(used)
    return sorted(models, key=lambda m: m.name.lower())


def find_local(name: str, cache_dir: Path | None = None) -> LocalModel | None:
    """The local model known as `name` (alias, repo id or registered name; case-insensitive)."""
    wanted = name.lower()
    for model in list_models(cache_dir):
        keys = {model.name, model.repo_id or "", model.alias or ""}
        if wanted in {k.lower() for k in keys if k}:
            return model
    return None
