"""A local stand-in for the Hugging Face hub: enough of its HTTP API for huggingface_hub 2.x.

Serves repos from memory on 127.0.0.1 (port 0) with a threaded `http.server`:

- GET  /api/models/{org}/{name}[/revision/{rev}]   model_info (`?blobs=true`: sizes, blob ids, LFS)
- GET  /api/models/{org}/{name}/tree/{rev}[/path]  list_repo_tree
- HEAD/GET /{org}/{name}/resolve/{rev}/{file}      X-Repo-Commit, ETag, X-Linked-Etag/-Size for
                                                   LFS files, Content-Length, Range (206) support
- 404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound.

No Xet headers are ever sent, so clients download over plain HTTP. Faults for tests:
`drop_once(file, after_bytes)` closes the connection mid-body once; `stall(file, after_bytes)`
sends the headers and the body up to that byte, then nothing more until `unstall()`;
`go_down()` answers 503 to everything until `come_back()`. Every request is logged in
`requests` (method, path, Range). `SilentHub` is a hub that accepts connections and never
answers at all.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth", ".pt", ".model")


@dataclass(frozen=True)
class FakeFile:
    """One file of a fake repo with the identifiers the hub reports for it."""

    path: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.data)}\n"
        ).encode()

    @property
    def blob_id(self) -> str:
        """The git blob sha1 (of the LFS pointer for LFS files, as on the hub)."""
        body = self.pointer if self.lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(body) + body, usedforsecurity=False).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class FakeRepo:
    """A model repo at one commit."""

    repo_id: str
    files: dict[str, FakeFile]
    commit: str = ""

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.repo_id.encode(), usedforsecurity=False)
        for name in sorted(self.files):
            digest.update(name.encode() + self.files[name].etag.encode())
        self.commit = digest.hexdigest()


@dataclass
class _Faults:
    drops: dict[str, int] = field(default_factory=dict)  # repo path -> bytes before the drop
    stalls: dict[str, int] = field(default_factory=dict)  # repo path -> byte where it stalls
    released: threading.Event = field(default_factory=threading.Event)  # stalls end when set
    down: bool = False
    down_after_drop: bool = False


class FakeHub:
    """The fake hub server; use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.faults = _Faults()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- content ----------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> FakeRepo:
        """Serve `files` (path -> bytes) as `repo_id`."""
        repo = FakeRepo(
            repo_id, {p: FakeFile(p, d, p.endswith(LFS_SUFFIXES)) for p, d in files.items()}
        )
        self.repos[repo_id] = repo
        return repo

    def add_repo_from_dir(
        self, repo_id: str, directory: Path, extra: dict[str, bytes] | None = None
    ) -> FakeRepo:
        """Serve the files of `directory` (plus `extra`) as `repo_id`."""
        files = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        return self.add_repo(repo_id, {**files, **(extra or {})})

    # ---- faults -----------------------------------------------------------------------------
    def drop_once(self, path: str, after_bytes: int, *, then_go_down: bool = False) -> None:
        """Close the connection after `after_bytes` of the next GET of `path`."""
        self.faults.drops[path] = after_bytes
        self.faults.down_after_drop = then_go_down

    def stall(self, path: str, after_bytes: int) -> None:
        """Every GET of `path` sends its headers and the body up to byte `after_bytes` of the
        file, then holds the connection silent until `unstall()` (a hub that hangs mid-body)."""
        self.faults.released.clear()
        self.faults.stalls[path] = after_bytes

    def unstall(self) -> None:
        """End every stall: held connections close, later GETs are served whole."""
        self.faults.stalls.clear()
        self.faults.released.set()

    def go_down(self) -> None:
        """Answer 503 to every request (a hub outage)."""
        self.faults.down = True

    def come_back(self) -> None:
        """End an outage."""
        self.faults.down = False

    def gets_of(self, path: str) -> list[str | None]:
        """The Range headers of each GET of a repo file path (None: whole file)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + path)]

    # ---- server -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the hub first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_HubHandler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.faults.released.set()  # no handler thread outlives the hub in a stall
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _HubHandler(BaseHTTPRequestHandler):
    owner: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        return None

    # ---- helpers ----------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: Any) -> None:
        self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _repo(self, repo_id: str, revision: str) -> FakeRepo | None:
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return repo

    # ---- routing ----------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        split = urlsplit(self.path)
        parts = [unquote(p) for p in split.path.split("/") if p]
        hub = self.owner
        with hub._lock:
            hub.requests.append((self.command, split.path, self.headers.get("Range")))
            down = hub.faults.down
        if down:
            self._error(503, None, "Service Unavailable")
            return
        query = parse_qs(split.query)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            rest = parts[4:]
            if not rest:
                self._model_info(repo_id, "main", query)
            elif rest[0] == "revision" and len(rest) >= 2:
                self._model_info(repo_id, "/".join(rest[1:]), query)
            elif rest[0] == "tree" and len(rest) >= 2:
                self._tree(repo_id, rest[1], "/".join(rest[2:]))
            else:
                self._error(404, None, "Not found")
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        else:
            self._error(404, None, "Not found")

    def _model_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in repo.files.values():
            entry: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                entry.update(size=len(f.data), blobId=f.blob_id)
                if f.lfs:
                    entry["lfs"] = {
                        "size": len(f.data),
                        "sha256": f.sha256,
                        "pointerSize": len(f.pointer),
                    }
            siblings.append(entry)
        self._json(
            {
                "_id": repo.commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": ["mlx"],
                "library_name": "mlx",
                "lastModified": "2026-11-29T00:00:00.000Z",
                "siblings": siblings,
            }
        )

    def _tree(self, repo_id: str, revision: str, prefix: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        items = []
        for f in repo.files.values():
            if prefix and not f.path.startswith(prefix.rstrip("/") + "/"):
                continue
            item: dict[str, Any] = {
                "type": "file",
                "oid": f.blob_id,
                "size": len(f.data),
                "path": f.path,
            }
            if f.lfs:
                item["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": len(f.pointer)}
            items.append(item)
        self._json(items)

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        f = repo.files.get(path)
        if f is None:
            self.send_response(404)
            for k, v in {
                "X-Error-Code": "EntryNotFound",
                "X-Error-Message": "Entry not found",
                "X-Repo-Commit": repo.commit,
                "Content-Length": "0",
            }.items():
                self.send_header(k, v)
            self.end_headers()
            return
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{f.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(len(f.data))
        start = 0
        status = 200
        range_header = self.headers.get("Range")
        if range_header and range_header.startswith("bytes=") and self.command == "GET":
            start = int(range_header[len("bytes=") :].split("-")[0] or 0)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(f.data) - 1}/{len(f.data)}"
        body = f.data[start:]
        hub = self.owner
        with hub._lock:
            drop_at = hub.faults.drops.pop(path, None) if self.command == "GET" else None
            stall_at = hub.faults.stalls.get(path) if self.command == "GET" else None
        if stall_at is not None:
            self._stall(status, headers, body[: max(0, stall_at - start)], len(body))
            return
        if drop_at is None:
            self._send(status, body, headers)
            return
        # Announce the whole body, send part of it, and hang up: a dropped connection.
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:drop_at])
        self.wfile.flush()
        if hub.faults.down_after_drop:
            hub.faults.down = True
        self.close_connection = True
        self.connection.shutdown(2)

    def _stall(self, status: int, headers: dict[str, str], part: bytes, length: int) -> None:
        """Announce `length` bytes, send `part` of them, then go silent until released."""
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.write(part)
        self.wfile.flush()
        self.owner.faults.released.wait()
        self.close_connection = True


class SilentHub:
    """A hub that accepts TCP connections and never sends a byte (nor reads one).

    The connections stay open until `stop()`, as behind a proxy that hangs.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        host, port = self._listener.getsockname()[:2]
        self.url = f"http://{host}:{port}"

    @property
    def connections(self) -> int:
        """How many connections it accepted so far."""
        return len(self._held)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by stop()
                return
            self._held.append(conn)

    def __enter__(self) -> SilentHub:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(5)
        self._listener.close()
        for conn in self._held:
            conn.close()


# ---- repos the store tests serve --------------------------------------------------------------

TINY_REPO = "test-org/tiny-mlx"
# Duplicates and extras a real repo carries; an MLX pull must skip every one of them.
NON_MLX_FILES = {
    "pytorch_model.bin": b"\x00" * 4096,
    "model-q4_k_m.gguf": b"GGUF" + b"\x00" * 2048,
    "original/consolidated.safetensors": b"\x00" * 1024,
    "README.md": b"# tiny\n",
    ".gitattributes": b"*.safetensors filter=lfs\n",
}


def serve_test_repos(hub: FakeHub, tiny_dir: Path) -> dict[str, FakeRepo]:
    """Serve the tiny model (with extras), plus repos MLX must refuse."""
    tiny_files = {p.name: p.read_bytes() for p in sorted(tiny_dir.iterdir()) if p.is_file()}
    config = json.loads(tiny_files["config.json"])
    no_safetensors = {k: v for k, v in tiny_files.items() if not k.endswith(".safetensors")} | {
        "pytorch_model.bin": b"\x00" * 4096
    }
    unknown_arch = tiny_files | {
        "config.json": json.dumps(config | {"model_type": "frobnicator"}).encode()
    }
    return {
        TINY_REPO: hub.add_repo(TINY_REPO, tiny_files | NON_MLX_FILES),
        "test-org/torch-only": hub.add_repo("test-org/torch-only", no_safetensors),
        "test-org/unknown-arch": hub.add_repo("test-org/unknown-arch", unknown_arch),
    }
