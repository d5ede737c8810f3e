"""`mlx models pull`: plan (what to fetch, does it fit, can MLX load it), then download.

Downloads go through huggingface_hub (its API client, auth headers, `http_get` and cache
layout) into the standard hub cache. Two things are our own because huggingface_hub 2.x no
longer offers them: a resume that survives the process (each file streams into
`blobs/<etag>.incomplete`, which a reconnection or the next pull continues with an HTTP Range
request; the library deletes its partial files on failure), and
registration last — snapshot links and the ref are written only once every file is present and
checked, so an interrupted pull leaves nothing that `list` or `resolve_model` would offer.
A pull of pipeline ranks (`shard=`) fetches only their files (store/shards.py) and leaves the
shard marker that tells the inventory which files this directory is meant to hold.
Every request carries the connect and read timeouts of `HubTimeouts` (store/hub_timeouts.py):
a hub that stops answering is a `HubTimeout`, never a wait without end.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx2
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import (
    WeakFileLock,
    build_hf_headers,
    get_session,
    hf_raise_for_status,
)

from mlxlaunch import __version__
from mlxlaunch.errors import ModelNotFound, NetworkError
from mlxlaunch.store.catalog import alias_for_repo, catalog_entry
from mlxlaunch.store.errors import NoSuchRevision, NotAHubName, NotAnMlxModel
from mlxlaunch.store.facts import mlx_lm_model_module
from mlxlaunch.store.hub_timeouts import HubTimeouts, hub_timeout, transport_failure
from mlxlaunch.store.memory import MemoryFit, memory_fit
from mlxlaunch.store.paths import hub_cache_dir, hub_endpoint
from mlxlaunch.store.progress import PullProgress, SilentProgress
from mlxlaunch.store.resolve import is_repo_id
from mlxlaunch.store.selection import check_repo_files
from mlxlaunch.store.shards import (
    INDEX_FILE,
    WEIGHT_SUFFIX,
    ShardMarker,
    ShardSpec,
    files_for_ranks,
    read_marker,
    write_marker,
)
from mlxlaunch.store.verify import VerifyReport, verify_model_dir

LIBRARY = "mlxlaunch"
RETRY_BACKOFF_S = 0.5


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch, with what identifies its bytes."""

    name: str
    size: int
    etag: str  # the cache's blob name: LFS sha256, else git blob id
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1 (non-LFS files)


@dataclass(frozen=True)
class PullPlan:
    """What a pull will do, decided before any byte of weights moves."""

    repo_id: str
    alias: str | None
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]
    skipped: tuple[str, ...]  # repo files MLX does not need
    problems: tuple[str, ...]
    fit: MemoryFit
    config: dict[str, Any] = field(default_factory=dict)
    shard: ShardSpec | None = None  # pipeline ranks this pull is for; None: the whole model
    other_ranks: tuple[str, ...] = ()  # weight files only other ranks load (not fetched)

    @property
    def total_bytes(self) -> int:
        """Bytes of all files to have locally."""
        return sum(f.size for f in self.files)

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weight files (what memory must hold)."""
        return sum(f.size for f in self.files if f.name.endswith(".safetensors"))


@dataclass(frozen=True)
class PullResult:
    """A finished pull: where the model is and what the check after download found."""

    path: Path
    downloaded_bytes: int
    report: VerifyReport


def to_repo_id(name: str) -> tuple[str, str | None]:
    """(repo id, alias) for an alias or an `org/repo` name."""
    if (entry := catalog_entry(name)) is not None:
        return entry.repo_id, entry.alias
    if is_repo_id(name):
        return name, alias_for_repo(name)
    raise NotAHubName(name)


@contextlib.contextmanager
def hub_errors(repo_id: str, endpoint: str, timeouts: HubTimeouts) -> Iterator[None]:
    """Turn huggingface_hub/httpx failures into the product's typed errors."""
    offline_hint = "check the network (or HF_ENDPOINT); models already pulled keep working"
    try:
        yield
    except GatedRepoError as e:
        raise ModelNotFound(
            f"'{repo_id}' is gated on the hub",
            hint="accept its terms on the hub page and set HF_TOKEN",
        ) from e
    except RepositoryNotFoundError as e:
        raise ModelNotFound(
            f"no model '{repo_id}' on the hub ({endpoint})",
            hint="check the spelling; private repos need HF_TOKEN",
        ) from e
    except RevisionNotFoundError as e:
        raise NoSuchRevision(repo_id) from e
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as e:
        message = f"cannot reach the hub at {endpoint} (offline)"
        raise NetworkError(message, hint=offline_hint) from e
    except httpx2.TimeoutException as e:
        raise hub_timeout(e, endpoint, timeouts) from e
    except httpx2.TransportError as e:
        raise NetworkError(
            f"cannot reach the hub at {endpoint}: {transport_failure(e)}",
            hint=offline_hint + "; run the same pull again to resume",
        ) from e
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise NetworkError(
            f"the hub answered HTTP {status} for '{repo_id}'",
            hint="try again later; run the same pull again to resume",
        ) from e


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _fetch_json(
    repo_id: str, filename: str, commit: str, endpoint: str, timeouts: HubTimeouts
) -> dict[str, Any]:
    """A small JSON file's content, read without touching the cache (planning has no effects)."""
    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint)
    headers = build_hf_headers(library_name=LIBRARY, library_version=__version__)
    response = get_session().get(url, headers=headers, timeout=timeouts.httpx())
    hf_raise_for_status(response)
    data = response.json()
    return data if isinstance(data, dict) else {}


def plan_pull(
    name: str,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    total_memory: int | None = None,
    timeouts: HubTimeouts | None = None,
    shard: ShardSpec | None = None,
) -> PullPlan:
    """Ask the hub about `name` and decide what to fetch; downloads nothing.

    Args:
        timeouts: per-request bounds (default: `HubTimeouts.from_env()`).
        shard: pipeline ranks to fetch the files of (their layers' weight files per
            model.safetensors.index.json, the non-layer weights, every non-weight file).

    Raises:
        ModelNotFound: no such repo or revision on the hub.
        HubTimeout: the hub did not answer in time.
        NetworkError: the hub cannot be reached.
        ConfigError: `shard` does not fit the model (more ranks than layers, layers missing).
    """
    repo_id, alias = to_repo_id(name)
    base = endpoint or hub_endpoint()
    if _offline():
        raise NetworkError("HF_HUB_OFFLINE is set: pulling needs the hub", hint="unset it")
    timeouts = timeouts or HubTimeouts.from_env()
    # model_info takes one number, which bounds the connection and each read alike.
    info_timeouts = HubTimeouts(read_s=timeouts.read_s, connect_s=timeouts.read_s)
    with hub_errors(repo_id, base, info_timeouts):
        info = HfApi(endpoint=base, library_name=LIBRARY, library_version=__version__).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=timeouts.read_s
        )
    with hub_errors(repo_id, base, timeouts):
        if info.sha is None:
            raise NetworkError(f"the hub at {base} sent no commit for '{repo_id}'")
        siblings = info.siblings or []
        check = check_repo_files(s.rfilename for s in siblings)
        config = (
            _fetch_json(repo_id, "config.json", info.sha, base, timeouts)
            if "config.json" in check.files
            else {}
        )
        if shard is not None and shard.whole:
            shard = None
        index = (
            _fetch_json(repo_id, INDEX_FILE, info.sha, base, timeouts)
            if shard is not None and INDEX_FILE in check.files
            else {}
        )
    problems = list(check.problems)
    if config and mlx_lm_model_module(config) is None:
        problems.append(f"unsupported architecture '{config.get('model_type')}' (not in mlx-lm)")
    by_name = {s.rfilename: s for s in siblings}
    wanted = list(check.files)
    other_ranks: list[str] = []
    if shard is not None:
        weight_map = index.get("weight_map")
        weight_map = weight_map if isinstance(weight_map, dict) else {}
        keep = files_for_ranks(config, weight_map, wanted, shard)
        other_ranks = [f for f in wanted if f not in keep]
        wanted = [f for f in wanted if f in keep]
        if not other_ranks:
            shard = None  # these ranks need every file: a whole model
    files = []
    for fname in wanted:
        s = by_name[fname]
        sha256 = s.lfs.sha256 if s.lfs is not None else None
        etag = sha256 or s.blob_id
        if etag is None or s.size is None:
            raise NetworkError(f"the hub sent no size/hash for {fname} in '{repo_id}'")
        files.append(RemoteFile(fname, int(s.size), etag, sha256, s.blob_id))
    weights = sum(f.size for f in files if f.name.endswith(".safetensors"))
    return PullPlan(
        repo_id=repo_id,
        alias=alias,
        revision=revision or "main",
        commit=info.sha,
        files=tuple(files),
        skipped=tuple(sorted(set(by_name) - set(check.files))),
        problems=tuple(problems),
        fit=memory_fit(weights, total_memory),
        config=config,
        shard=shard,
        other_ranks=tuple(other_ranks),
    )


def _git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checksum_ok(path: Path, remote: RemoteFile) -> bool:
    """True when `path` holds exactly the bytes the hub described."""
    if remote.sha256 is not None:
        return _sha256(path) == remote.sha256
    if remote.blob_id is not None:
        return _git_blob_sha1(path) == remote.blob_id
    return path.stat().st_size == remote.size


def _partial(blob: Path) -> Path:
    # huggingface_hub names its own temporaries `<etag>.<random>.incomplete`; this fixed name is
    # ours, so the next pull finds it. scan_cache_dir reports both as incomplete files.
    return blob.with_name(blob.name + ".incomplete")


def _bytes_present(storage: Path, f: RemoteFile) -> int:
    blob = storage / "blobs" / f.etag
    if blob.is_file():
        return f.size
    partial = _partial(blob)
    return min(partial.stat().st_size, f.size) if partial.is_file() else 0


def _stream_into(
    url: str, out: BinaryIO, resume: int, sink: PullProgress, timeouts: HubTimeouts
) -> None:
    """GET `url` from byte `resume` on, appending to `out` as bytes arrive.

    Bytes are written as the socket yields them (no large read buffer), so a dropped connection
    loses nothing already received.
    """
    headers = build_hf_headers(library_name=LIBRARY, library_version=__version__)
    headers["Accept-Encoding"] = "identity"  # sizes and ranges must count the file's own bytes
    if resume:
        headers["Range"] = f"bytes={resume}-"
    with get_session().stream("GET", url, headers=headers, timeout=timeouts.httpx()) as response:
        hf_raise_for_status(response)
        if resume and response.status_code == 200:  # the server ignored the range: start over
            out.seek(0)
            out.truncate()
            sink.advance(-resume)
        for chunk in response.iter_raw():
            out.write(chunk)
            sink.advance(len(chunk))


def _download(
    plan: PullPlan,
    f: RemoteFile,
    storage: Path,
    endpoint: str,
    sink: PullProgress,
    retries: int,
    timeouts: HubTimeouts,
) -> None:
    blob = storage / "blobs" / f.etag
    if blob.is_file():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial(blob)
    sink.file(f.name, f.size)
    url = hf_hub_url(plan.repo_id, f.name, revision=plan.commit, endpoint=endpoint)
    # The same lock huggingface_hub takes for this blob: two pulls never append to one file.
    lock = storage.parent / ".locks" / storage.name / f"{f.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if blob.is_file():  # another pull finished it while we waited
            return
        _download_locked(f, url, partial, sink, retries, timeouts)
        os.replace(partial, blob)


def _download_locked(
    f: RemoteFile,
    url: str,
    partial: Path,
    sink: PullProgress,
    retries: int,
    timeouts: HubTimeouts,
) -> None:
    if partial.is_file() and partial.stat().st_size > f.size:  # not a prefix of this file
        partial.unlink()
    with partial.open("r+b" if partial.is_file() else "wb") as out:
        for attempt in range(retries + 1):
            out.seek(0, os.SEEK_END)
            if out.tell() >= f.size:
                break
            start = out.tell()
            try:
                _stream_into(url, out, start, sink, timeouts)
            except httpx2.TransportError as exc:
                # A dropped connection or a stall: keep what arrived and ask for the rest —
                # unless the hub sent nothing for a whole timeout: then another try would
                # only wait as long again.
                stalled = isinstance(exc, httpx2.TimeoutException) and out.tell() == start
                if attempt == retries or stalled:
                    raise
                out.flush()
                time.sleep(RETRY_BACKOFF_S * 2**attempt)
    if partial.stat().st_size != f.size or not checksum_ok(partial, f):
        partial.unlink()
        raise NetworkError(
            f"{f.name} arrived corrupted (size or checksum mismatch)",
            hint="run the same pull again to fetch it anew",
        )


def pull(
    plan: PullPlan,
    *,
    cache_dir: Path | None = None,
    endpoint: str | None = None,
    progress: PullProgress | None = None,
    force: bool = False,
    retries: int = 3,
    timeouts: HubTimeouts | None = None,
) -> PullResult:
    """Download what `plan` lists, register it in the cache, and check the model loads.

    Args:
        plan: from `plan_pull`.
        cache_dir: the hub cache (default: HF_HUB_CACHE / HF_HOME rules).
        endpoint: the hub (default: HF_ENDPOINT or huggingface.co).
        progress: where progress goes (default: nowhere).
        force: pull even when the plan found problems.
        retries: reconnections per file after a dropped connection (each resumes).
        timeouts: per-request bounds (default: `HubTimeouts.from_env()`).

    Raises:
        NotAnMlxModel: the plan found problems and `force` is False.
        HubTimeout: the hub stopped answering; a rerun resumes where this one stopped.
        NetworkError / ModelNotFound: the hub failed; a rerun resumes where this one stopped.
    """
    if plan.problems and not force:
        raise NotAnMlxModel(plan.repo_id, plan.problems)
    cache = (cache_dir or hub_cache_dir()).expanduser().resolve()
    base = endpoint or hub_endpoint()
    storage = cache / repo_folder_name(repo_id=plan.repo_id, repo_type="model")
    sink = progress or SilentProgress()
    timeouts = timeouts or HubTimeouts.from_env()
    already = sum(_bytes_present(storage, f) for f in plan.files)
    sink.begin(plan.total_bytes, already)
    try:
        with hub_errors(plan.repo_id, base, timeouts):
            for f in plan.files:
                _download(plan, f, storage, base, sink, retries, timeouts)
        snapshot = _register(plan, storage)
    finally:
        sink.end()
    return PullResult(snapshot, plan.total_bytes - already, verify_model_dir(snapshot))


def _register(plan: PullPlan, storage: Path) -> Path:
    """Link every blob into the snapshot and write the ref — the last step of a pull.

    The links are the hub cache's own layout (`snapshots/<commit>/<file>` → `../../blobs/<etag>`,
    relative), made here rather than by `hf_hub_download`, which would first ask the hub about
    each file again: a request per file, and minutes of retries when the hub stalls right then.
    """
    snapshot = storage / "snapshots" / plan.commit
    # Weights last: a snapshot is only "complete" (see inventory) once they are linked.
    for f in sorted(plan.files, key=lambda f: f.name.endswith(WEIGHT_SUFFIX)):
        link = snapshot / f.name
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(storage / "blobs" / f.etag, link.parent)
        tmp = link.with_name(f".{link.name}.{os.getpid()}.link")
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    write_marker(snapshot, _marker_after(plan, snapshot))
    if plan.revision != plan.commit:
        ref = storage / "refs" / plan.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(ref.name + ".tmp")
        tmp.write_text(plan.commit, encoding="utf-8")
        os.replace(tmp, ref)
    return snapshot


def _marker_after(plan: PullPlan, snapshot: Path) -> ShardMarker | None:
    """The shard marker once `plan` is in `snapshot`: None when the directory now holds the
    whole model (a full pull, or shard pulls that together fetched every file)."""
    if plan.shard is None:
        return None
    mine = tuple(sorted(f.name for f in plan.files if f.name.endswith(WEIGHT_SUFFIX)))
    marker = ShardMarker(plan.shard, mine)
    if (before := read_marker(snapshot)) is not None:
        marker = before.merged(marker)
    if all((snapshot / name).is_file() for name in plan.other_ranks):
        return None
    return marker
