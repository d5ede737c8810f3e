"""Robustness II, items 3-5: the cache directory is data, checked before use and never trusted.

3. A KV file of another model relabelled with this model's identity was accepted; used, it
   answered 500 "Cannot broadcast array of shape …" to every request of the batch, and again
   after each restart. Entries are now compared with the model's cache layout first.
4. The identity covered the weights' sizes only: weights rebuilt with the same shapes at the
   same path reused the old KV. It now hashes their content (remembered by mtime/inode).
5. Eviction deleted files outside the cache: through a symlinked identity directory, and a
   foreign `data.json` + `data.safetensors` pair in another subdirectory; a data file
   symlinked to /etc/passwd was read. Nothing is followed through a symlink now, and only
   files this server wrote are ever removed or counted.

Then a hypothesis pass over random cache-directory contents (names, bytes, JSON shapes,
symlinks, directories where files belong): the store opens, saves and loads, and nothing but
what it wrote changes. Tests that serve a real model are marked slow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import string
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from mlx_lm.models.cache import KVCache, RotatingKVCache

from mlxlaunch.engine.cache import weight_identity
from mlxlaunch.engine.cache.disk import (
    FORMAT,
    TMP_NAME,
    WRITER,
    DiskCache,
    UnsafeCacheDir,
    open_disk_cache,
    tokens_key,
)
from mlxlaunch.engine.cache.entry_check import KVLayout
from mlxlaunch.engine.cache.weight_identity import MEMO_FILE, model_identity

IDENTITY = "0123456789abcdef01234567"
OLD = 1_000_000_000.0  # an mtime long past: stale for every cleanup rule


def kv(tokens: int, *, heads: int = 1, dim: int = 32, dtype: Any = mx.float32) -> KVCache:
    cache = KVCache()
    keys = mx.random.normal((1, heads, tokens, dim)).astype(dtype)
    cache.update_and_fetch(keys, keys)
    return cache


def keys_of(cache: KVCache) -> mx.array:
    assert cache.keys is not None
    return cache.keys[..., : cache.offset, :]


# The tiny test model's layout: one layer of KVCache, 1 KV head of dimension 32, float32.
LAYOUT = KVLayout.of_caches([kv(1)], [kv(2)])


def store(root: Path, budget: int = 1 << 30, layout: KVLayout | None = LAYOUT) -> DiskCache:
    return DiskCache(root, IDENTITY, budget, layout=layout)


def fake_model(directory: Path, weights: bytes = b"w" * 1000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text('{"model_type": "qwen3"}')
    (directory / "model.safetensors").write_bytes(weights)
    return directory


# --- 3: an entry of another model is never used --------------------------------------------

FOREIGN: dict[str, Callable[[int], list[Any]]] = {
    "kv heads": lambda n: [kv(n, heads=2)],
    "head dim": lambda n: [kv(n, dim=64)],
    "dtype": lambda n: [kv(n, dtype=mx.bfloat16)],
    "layers": lambda n: [kv(n), kv(n)],
    "cache class": lambda n: [_rotating(n)],
    "positions": lambda n: [_short(n)],
}


def _rotating(tokens: int) -> RotatingKVCache:
    cache = RotatingKVCache(max_size=256)
    keys = mx.random.normal((1, 1, tokens, 32))
    cache.update_and_fetch(keys, keys)
    return cache


def _short(tokens: int) -> KVCache:
    cache = kv(tokens)
    cache.offset = tokens - 1  # holds fewer positions than the entry claims
    return cache


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_another_models_entry_relabelled_as_ours_is_skipped_and_logged_once(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = list(range(48))
    forger = store(tmp_path, layout=None)  # writes whatever it is given, under our identity
    assert forger.save(tokens, FOREIGN[kind](len(tokens))) is not None
    disk = store(tmp_path)
    (entry,) = disk.entries
    with caplog.at_level(logging.WARNING):
        assert disk.load(entry) is None
        assert disk.best(tokens) == (None, 0)  # skipped for good: not offered again
    assert disk.rejected == 1
    assert len([r for r in caplog.records if "ignoring" in r.getMessage()]) == 1
    assert list((tmp_path / IDENTITY).iterdir()) == []  # ours (it carries our marker): gone


def test_a_matching_entry_loads_and_a_bad_one_beside_it_costs_only_itself(tmp_path: Path) -> None:
    good, bad = list(range(40)), list(range(100, 140))
    forger = store(tmp_path, layout=None)
    forger.save(bad, [kv(len(bad), heads=2)])
    saved = [kv(len(good))]
    forger.save(good, saved)
    disk = store(tmp_path)
    loaded = [disk.load(e) for e in sorted(disk.entries, key=lambda e: int(e.tokens[0]))]
    assert loaded[1] is None
    assert loaded[0] is not None and mx.array_equal(keys_of(loaded[0][0]), keys_of(saved[0])).item()


@pytest.mark.parametrize(("name", "layout"), [("ArraysCache", LAYOUT), ("make_prompt_cache", None)])
def test_a_header_naming_another_class_is_rejected_before_one_is_built(
    tmp_path: Path, name: str, layout: KVLayout | None
) -> None:
    tokens = list(range(32))
    entry = store(tmp_path).save(tokens, [kv(len(tokens))])
    assert entry is not None
    data = tmp_path / IDENTITY / f"{entry.key}.safetensors"
    loaded: Any = mx.load(str(data), return_metadata=True)
    arrays, metadata = loaded
    mx.save_safetensors(str(data), arrays, {**metadata, "1.0": name})
    meta = tmp_path / IDENTITY / f"{entry.key}.json"
    about = json.loads(meta.read_text())
    raw = data.read_bytes()
    meta.write_text(
        json.dumps({**about, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
    )
    reopened = store(tmp_path, layout=layout)
    assert reopened.load(reopened.entries[0]) is None and reopened.rejected == 1


def test_the_layout_read_off_a_model_tells_tokens_from_settings() -> None:
    class Windowed:
        """Stands in for a model: one rotating layer (window 64) after one KV layer."""

        def make_cache(self) -> list[Any]:
            return [KVCache(), RotatingKVCache(max_size=64, keep=4)]

        def __call__(self, tokens: mx.array, cache: list[Any]) -> None:
            keys = mx.zeros((1, 2, tokens.shape[1], 8))
            for c in cache:
                c.update_and_fetch(keys, keys)

    layout = KVLayout.of_model(Windowed())  # type: ignore[arg-type]
    assert layout is not None and layout.classes == ("KVCache", "RotatingKVCache")
    assert dict(layout.arrays)["0.0"].shape == (1, 2, None, 8)
    rotating = RotatingKVCache(max_size=32, keep=4)  # another window: not this model's
    keys = mx.zeros((1, 2, 10, 8))
    rotating.update_and_fetch(keys, keys)
    problem = layout.cache_problem([kv(10, heads=2, dim=8), rotating], 10)
    assert problem is not None and "1.4" in problem  # max_size is the state's 5th item


# --- 4: the identity follows the weights' content ------------------------------------------


def test_weights_rebuilt_with_the_same_size_at_the_same_path_change_the_identity(
    tmp_path: Path,
) -> None:
    model = fake_model(tmp_path / "model", b"a" * 4096)
    before = model_identity(model, ["KVCache"], memo_dir=tmp_path / "cache")
    (model / "model.safetensors").write_bytes(b"b" * 4096)  # same size, other content
    after = model_identity(model, ["KVCache"], memo_dir=tmp_path / "cache")
    assert before != after
    assert model_identity(model, ["KVCache"]) == after  # the memo only saves work


def test_weight_digests_are_remembered_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[Path] = []
    real = weight_identity.file_digest

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(weight_identity, "file_digest", counting)
    model, cache = fake_model(tmp_path / "model"), tmp_path / "cache"
    first = model_identity(model, ["KVCache"], memo_dir=cache)
    assert model_identity(model, ["KVCache"], memo_dir=cache) == first
    assert len(hashed) == 1  # a restart rehashes nothing unchanged
    os.utime(model / "model.safetensors", (OLD, OLD))  # touched: hashed again, same content
    assert model_identity(model, ["KVCache"], memo_dir=cache) == first
    assert len(hashed) == 2


MEMOS = [b"[]", b"null", b"1e400", b'{"files": []}', b"\xff\xfe", b"[" * 100_000, b"dir"]


@pytest.mark.parametrize("memo", MEMOS, ids=[str(i) for i in range(len(MEMOS))])
def test_a_memo_that_is_not_ours_is_neither_trusted_nor_overwritten(
    tmp_path: Path, memo: bytes
) -> None:
    model, cache = fake_model(tmp_path / "model"), tmp_path / "cache"
    expected = model_identity(model, ["KVCache"])
    cache.mkdir()
    path = cache / MEMO_FILE
    if memo == b"dir":
        path.mkdir()
    else:
        path.write_bytes(memo)
    assert model_identity(model, ["KVCache"], memo_dir=cache) == expected
    assert path.is_dir() if memo == b"dir" else path.read_bytes() == memo


def test_a_file_hashed_in_parallel_chunks_has_a_stable_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(os.urandom(10_000))
    whole = weight_identity.file_digest(path)
    monkeypatch.setattr(weight_identity, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(weight_identity, "READ_BYTES", 1000)
    chunked = weight_identity.file_digest(path)
    assert chunked != whole  # the chunking is part of the digest: fixed, not tunable
    assert weight_identity.file_digest(path) == chunked


@pytest.mark.slow
async def test_an_engine_over_rebuilt_weights_does_not_reuse_the_old_kv(tmp_path: Path) -> None:
    from test_disk_cache import first_session, first_turn, run_cold

    from mlxlaunch.testing.builder import build_model

    model, root = build_model(tmp_path / "model", "tiny", seed=0), tmp_path / "cache"
    await first_session(model, root)
    before = {p.parent.name for p in root.glob("*/*.safetensors")}
    size = (model / "model.safetensors").stat().st_size
    build_model(model, "tiny", seed=1)  # the same shapes, at the same path: other weights
    assert (model / "model.safetensors").stat().st_size == size
    request = first_turn("Task B: speed up the tests.")
    done, text, expected, figures = await run_cold(model, root, request)
    assert done.usage.cached_tokens == 0 and figures.disk_loads == 0
    assert text == expected
    assert {p.parent.name for p in root.glob("*/*.safetensors")} - before  # a new identity


# --- 5: nothing outside what the store wrote is followed, read, counted or removed ----------


def test_a_symlinked_identity_directory_is_not_used(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("notes.json", "photo.safetensors", ".tmp-draft"):
        (elsewhere / name).write_text(name)
        os.utime(elsewhere / name, (OLD, OLD))
    root = tmp_path / "cache"
    root.mkdir()
    (root / IDENTITY).symlink_to(elsewhere)
    with pytest.raises(UnsafeCacheDir):
        store(root, budget=1)
    assert sorted(p.name for p in elsewhere.iterdir()) == [
        ".tmp-draft",
        "notes.json",
        "photo.safetensors",
    ]


def test_an_identity_directory_swapped_for_a_symlink_later_is_not_followed(
    tmp_path: Path,
) -> None:
    root, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.json").write_text("mine")
    disk = store(root)
    (root / IDENTITY).rename(root / "moved")
    (root / IDENTITY).symlink_to(elsewhere)
    assert disk.save(list(range(40)), [kv(40)]) is not None
    assert [p.name for p in elsewhere.iterdir()] == ["notes.json"]  # written where it opened
    assert len(list((root / "moved").glob("*.safetensors"))) == 1


def test_eviction_never_touches_other_directories_of_the_root(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.json").write_text(json.dumps({"format": FORMAT, "tokens": [1, 2]}))
    (other / "data.safetensors").write_bytes(b"x" * 10_000)
    for path in other.iterdir():
        os.utime(path, (OLD, OLD))  # the oldest files under the root
    disk = store(tmp_path)
    first = disk.save(list(range(40)), [kv(40)])
    assert first is not None
    disk.budget_bytes = first.nbytes  # the next save must evict: ours alone go
    assert disk.save(list(range(100, 140)), [kv(40)]) is not None
    assert [e.key for e in disk.entries] != [first.key]
    assert sorted(p.name for p in other.iterdir()) == ["data.json", "data.safetensors"]


def test_only_our_entries_count_against_the_budget_and_go(tmp_path: Path) -> None:
    ours = store(tmp_path)
    first = ours.save(list(range(40)), [kv(40)])
    assert first is not None
    directory = tmp_path / IDENTITY
    key = "f" * 32  # named as ours, but without our marker: someone else's
    (directory / f"{key}.json").write_text(json.dumps({"format": FORMAT, "tokens": [1]}))
    (directory / f"{key}.safetensors").write_bytes(b"x" * 10 * first.nbytes)
    (directory / "photo.safetensors").write_bytes(b"x" * 10 * first.nbytes)
    for path in directory.iterdir():
        os.utime(path, (OLD, OLD))
    disk = store(tmp_path, budget=3 * first.nbytes)
    assert [e.key for e in disk.entries] == [first.key]
    assert disk.save(list(range(100, 140)), [kv(40)]) is not None
    assert len(disk.entries) == 2  # the foreign bytes did not push ours out
    names = {p.name for p in directory.iterdir()}
    assert {f"{key}.json", f"{key}.safetensors", "photo.safetensors"} <= names


def test_a_data_file_symlinked_outside_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    disk = store(tmp_path / "cache")
    tokens = list(range(8))
    key = tokens_key(tokens)
    directory = tmp_path / "cache" / IDENTITY
    (directory / f"{key}.safetensors").symlink_to(secret)
    about = {
        "format": FORMAT,
        "writer": WRITER,
        "model": IDENTITY,
        "tokens": tokens,
        "bytes": secret.stat().st_size,
        "sha256": hashlib.sha256(secret.read_bytes()).hexdigest(),
    }
    (directory / f"{key}.json").write_text(json.dumps(about))
    disk.scan()
    assert disk.entries == [] and disk.best(tokens) == (None, 0)
    assert (directory / f"{key}.safetensors").is_symlink()  # not ours to remove
    assert secret.read_bytes().startswith(b"root:")


def test_a_fifo_or_directory_where_an_entry_file_belongs_does_not_block_or_break(
    tmp_path: Path,
) -> None:
    directory = tmp_path / IDENTITY
    directory.mkdir()
    os.mkfifo(directory / f"{'a' * 32}.json")
    (directory / f"{'b' * 32}.json").mkdir()
    os.mkfifo(directory / f"{'b' * 32}.safetensors")
    disk = store(tmp_path)
    assert disk.entries == []
    assert disk.save(list(range(40)), [kv(40)]) is not None
    assert (directory / f"{'a' * 32}.json").exists()


def test_the_store_for_a_model_is_opened_with_its_layout(tmp_path: Path) -> None:
    class Tiny:
        def __init__(self) -> None:
            self.layers = [None]

        def __call__(self, tokens: mx.array, cache: list[Any]) -> None:
            keys = mx.zeros((1, 1, tokens.shape[1], 32))
            cache[0].update_and_fetch(keys, keys)

    model = fake_model(tmp_path / "model")
    disk = open_disk_cache(tmp_path / "cache", 1 << 30, Tiny(), model)  # type: ignore[arg-type]
    assert disk is not None and disk.layout == LAYOUT
    assert disk.identity == model_identity(model, ["KVCache"])
    assert (tmp_path / "cache" / MEMO_FILE).is_file()

    class Unrunnable(Tiny):
        def __call__(self, tokens: mx.array, cache: list[Any]) -> None:
            raise RuntimeError("needs images")

    assert open_disk_cache(tmp_path / "c2", 1 << 30, Unrunnable(), model) is None  # type: ignore[arg-type]


# --- hypothesis: random cache-directory contents -------------------------------------------

HEX = "0123456789abcdef"
NAMES = st.one_of(
    st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12).filter(
        lambda n: n not in (".", "..")
    ),
    st.builds(
        lambda key, suffix: key + suffix,
        st.text(HEX, min_size=32, max_size=32),
        st.sampled_from([".json", ".safetensors"]),
    ),
    st.sampled_from(
        ["data.json", "data.safetensors", "notes.json", "photo.safetensors", ".tmp-draft"]
    ),
    st.sampled_from([MEMO_FILE, IDENTITY, "render-date", "0" * 32 + ".json"]),
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
ENTRY_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "format": st.sampled_from([1, FORMAT, str(FORMAT), None]),
        "writer": st.sampled_from([WRITER, "someone"]),
        "model": st.sampled_from([IDENTITY, "other"]),
        "tokens": st.lists(st.integers(0, 50), max_size=6) | JSON,
        "bytes": st.integers(-1, 4096) | JSON,
        "sha256": st.text(HEX, max_size=64) | JSON,
    },
)
RAW = st.sampled_from(
    [b"1e400", b'{"tokens": [1e400]}', b"[" * 50_000, b'{"bytes": 1e400}', b"", b"\x00" * 64]
)
CONTENT = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=200)),
    st.tuples(st.just("bytes"), JSON.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just("bytes"), ENTRY_LIKE.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just("bytes"), RAW),
    st.tuples(st.sampled_from(["dir", "link_file", "link_dir", "dangling"]), st.just(b"")),
)
ITEMS = st.lists(
    st.tuples(st.sampled_from(["root", "identity", "other"]), NAMES, CONTENT, st.booleans()),
    max_size=12,
)
IDENTITY_KINDS = st.sampled_from(["dir", "dir", "dir", "absent", "symlink", "file"])


def plant(base: Path, items: list[tuple[str, str, tuple[str, bytes], bool]], kind: str) -> None:
    """Lay out `base/cache` (the root) and `base/outside` from a drawn description."""
    root, outside = base / "cache", base / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(b"root:x:0:0\n")
    (outside / "notes.json").write_text('{"format": 2}')
    root.mkdir()
    (root / "other").mkdir()
    if kind == "dir":
        (root / IDENTITY).mkdir()
    elif kind == "symlink":
        (root / IDENTITY).symlink_to(outside)
    elif kind == "file":
        (root / IDENTITY).write_bytes(b"not a directory")
    for place, name, (what, data), old in items:
        folder = {"root": root, "identity": root / IDENTITY, "other": root / "other"}[place]
        path = folder / name
        if not folder.is_dir() or folder.is_symlink() or os.path.lexists(path):
            continue
        if what == "bytes":
            path.write_bytes(data)
        elif what == "dir":
            path.mkdir()
            (path / "inside.json").write_text("{}")
        elif what == "link_file":
            path.symlink_to(outside / "passwd")
        elif what == "link_dir":
            path.symlink_to(outside)
        else:
            path.symlink_to(base / "nowhere")
        if old and not path.is_symlink():
            os.utime(path, (OLD, OLD))


def tree(base: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path under `base`, without following symlinks: what it is and holds."""
    found: dict[str, tuple[str, bytes | str]] = {}
    for folder, dirs, files in os.walk(base, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(base))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", "")
            elif path.is_fifo():
                found[rel] = ("fifo", "")
            else:
                found[rel] = ("file", path.read_bytes())
    return found


def written_by_the_store(rel: str, before: dict[str, tuple[str, bytes | str]]) -> bool:
    """Whether a path that existed before the store ran is one it may remove or touch: a
    regular file in its identity directory, under its own names, vouched for by our marker."""
    parts = Path(rel).parts
    if len(parts) != 3 or parts[:2] != ("cache", IDENTITY) or before[rel][0] != "file":
        return False
    if before.get(f"cache/{IDENTITY}", ("",))[0] != "dir":
        return False
    name = parts[2]
    if TMP_NAME.fullmatch(name):
        return True
    key = name.split(".", 1)[0]
    meta = before.get(f"cache/{IDENTITY}/{key}.json")
    if len(key) != 32 or meta is None or meta[0] != "file":
        return False
    try:
        about = json.loads(meta[1])
    except (ValueError, RecursionError, UnicodeDecodeError):
        return False
    return isinstance(about, dict) and about.get("writer") == WRITER


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(items=ITEMS, identity_kind=IDENTITY_KINDS)
def test_random_cache_directory_contents(
    tmp_path_factory: pytest.TempPathFactory,
    items: list[tuple[str, str, tuple[str, bytes], bool]],
    identity_kind: str,
) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    plant(base, items, identity_kind)
    root = base / "cache"
    model = fake_model(base / "outside" / "model")
    before = tree(base)
    identity = model_identity(model, ["KVCache"], memo_dir=root)  # a junk memo is no reason
    assert identity == model_identity(model, ["KVCache"])  # not to start, nor a wrong answer
    planted = root / IDENTITY
    usable = not os.path.lexists(planted) or (planted.is_dir() and not planted.is_symlink())
    try:
        disk = store(root, budget=1 << 30)
    except UnsafeCacheDir:
        assert not usable
    else:
        assert usable
        assert disk.entries == []  # nothing planted is an entry of ours
        saved = [kv(40)]
        first = disk.save(list(range(40)), saved)
        assert first is not None
        reopened = store(root)
        found, shared = reopened.best(list(range(40)))
        assert found is not None and shared == 40
        loaded = reopened.load(found)
        assert loaded is not None and mx.array_equal(keys_of(loaded[0]), keys_of(saved[0])).item()
        disk.budget_bytes = first.nbytes  # room for one: the next save evicts the first
        assert disk.save(list(range(100, 140)), [kv(40)]) is not None
        assert [e.key for e in disk.entries] != [first.key]
    after = tree(base)
    for rel, was in before.items():
        if not written_by_the_store(rel, before):
            assert after.get(rel) == was, rel
    for rel in after.keys() - before.keys():  # what the store added: under the root only
        assert rel.startswith("cache/"), rel


# --- through a real server ---------------------------------------------------------------

TOKEN = "cache-dir-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 30


def body(question: str) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 6,
        "temperature": 0,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": question}],
    }


@pytest.fixture
def serve(tiny_model_dir: Path) -> Iterator[Any]:
    """A factory of live servers on the tiny model over a cache directory (stopped on exit)."""
    from mlxlaunch.engine.config import EngineConfig
    from mlxlaunch.engine.engine import Engine
    from mlxlaunch.server.app import ServerSettings
    from mlxlaunch.server.runner import start_server

    running: list[tuple[Engine, Any]] = []

    def make(cache_dir: Path | None, **config: Any) -> tuple[Engine, str]:
        engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=cache_dir, **config))
        engine.start()
        handle = start_server(engine, ServerSettings(auth_token=TOKEN))
        running.append((engine, handle))
        return engine, handle.url

    def stop_all() -> None:
        while running:
            engine, handle = running.pop()
            handle.stop()
            engine.close()

    make.stop_all = stop_all  # type: ignore[attr-defined]
    yield make
    stop_all()


def ask(url: str, question: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/messages", content=json.dumps(body(question)), headers=HEADERS, timeout=120
    )


def answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return "".join(b.get("text", "") for b in response.json()["content"])


def asked_together(url: str, questions: list[str]) -> tuple[dict[str, str], list[int]]:
    """Each question in its own thread, /health polled meanwhile: answers, health statuses."""
    results: dict[str, httpx.Response] = {}
    health: list[int] = []

    def one(question: str) -> None:
        results[question] = ask(url, question)

    threads = [threading.Thread(target=one, args=(q,)) for q in questions]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        health.append(httpx.get(url + "/health", timeout=30).status_code)
    for thread in threads:
        thread.join()
    return {q: answer(results[q]) for q in questions}, health


@pytest.mark.slow
def test_a_foreign_entry_fails_no_request_over_http_across_restarts(
    serve: Any, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    questions = ["What is a trie?", "What is a heap?", "Name a prime.", "Why is the sky blue?"]
    _, url = serve(None, cache_memory_bytes=0)
    expected = {q: answer(ask(url, q)) for q in questions}
    _, url = serve(root, cache_block_tokens=16)
    answer(ask(url, "Prime the cache."))
    answer(ask(url, "Prime it again."))  # reuses the system prompt: saved at shutdown
    serve.stop_all()
    (meta,) = [p for p in root.glob("*/*.json") if p.stem != "render-date"]
    tokens = json.loads(meta.read_text())["tokens"]
    identity = meta.parent.name
    meta.unlink()
    meta.with_suffix(".safetensors").unlink()
    # Another model's KV (2 heads of 64, the small model's) relabelled with this identity.
    assert DiskCache(root, identity, 1 << 30).save(tokens, [kv(len(tokens), heads=2, dim=64)])

    for _restart in range(2):
        _, url = serve(root, cache_block_tokens=16)
        answers, health = asked_together(url, questions)
        assert answers == expected
        assert set(health) <= {200}
        serve.stop_all()
    kept = DiskCache(root, identity, 1 << 30, layout=LAYOUT)  # the tiny model's layout
    assert [kept.load(e) is not None for e in kept.entries] == [True] * len(kept.entries)
