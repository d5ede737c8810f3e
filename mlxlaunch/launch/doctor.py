"""`mlx doctor`: facts about this machine, judged into checks that each carry a fix.

`gather_facts()` reads the real machine; `run_checks(facts)` is pure, so tests inject facts
(no claude, little memory, no models) and read the verdicts.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mlxlaunch.blas import ENV_CHOICE
from mlxlaunch.blas_probe import BlasReport, blas_report
from mlxlaunch.cluster.link import LinkFigures
from mlxlaunch.cluster.preflight import MATCHED_PACKAGES, HostFacts, Preflight
from mlxlaunch.config import UserConfig, load_config
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.claude_bin import (
    CLAUDE_CODE_PACKAGE,
    CLAUDE_CODE_VERSION,
    INSTALL_FLAG,
    claude_version,
    find_claude,
    pinned_prefix,
)
from mlxlaunch.launch.node import (
    NODE_FIX,
    NodeFacts,
    format_version,
    node_facts,
    node_problem,
    runs_under_node,
)
from mlxlaunch.launch.state import RunState, running_servers
from mlxlaunch.server.search_backends import configured_backend
from mlxlaunch.store.catalog import CatalogEntry, Recommendation, recommendation
from mlxlaunch.store.compute import Compute
from mlxlaunch.store.memory import (
    GIB,
    KVShape,
    describe_windows,
    format_bytes,
    memory_fit,
    system_memory_bytes,
    windows_here,
)

Status = Literal["ok", "warn", "fail", "info"]

LOW_MEMORY = 16 * GIB  # below this only small models fit alongside the OS and an editor
DISK_HEADROOM = 2 * GIB


@dataclass(frozen=True)
class ModelFact:
    """One local model as the doctor sees it."""

    name: str
    weights_bytes: int
    problems: tuple[str, ...] = ()
    context_window: int | None = None  # its config's
    kv: KVShape | None = None  # what a token's KV holds (None: its config does not say)


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the checks look at; gathered from the machine or given by a test."""

    system: str  # platform.system(): "Darwin", "Linux", …
    machine: str  # platform.machine(): "arm64", "x86_64", …
    mlx_version: str | None  # None: mlx does not import
    device: str | None  # "gpu" or "cpu"
    backend_error: str | None
    total_memory: int
    claude_path: str | None
    claude_version: str | None
    models: tuple[ModelFact, ...]
    models_dir: str
    free_disk: int
    servers: tuple[RunState, ...] = field(default_factory=tuple)
    blas: BlasReport | None = None  # None: not measured (mlx does not load)
    claude_install_dir: str = ""  # where `--install-claude` puts the pinned Claude Code
    claude_needs_node: bool = False  # the claude found is a node script, not a native build
    node: NodeFacts | None = None  # None: not looked at
    cpu_count: int = 1
    # The user's settings: the model a launch serves, and the small one beside it for Claude
    # Code's haiku tier (None: not set).
    default_model: str | None = None
    small_model: str | None = None
    # The web search backend (`search.*` settings): what it is, or why it cannot serve.
    search: str | None = None
    search_problem: str | None = None

    @property
    def compute(self) -> Compute:
        """What MLX computes with here, for recommending a model that runs at a usable speed."""
        if self.device == "gpu":
            return Compute("metal" if self.system == "Darwin" else "cuda", self.cpu_count)
        return Compute("cpu", self.cpu_count)


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, what was found, and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


def _backend_check(f: DoctorFacts) -> Check:
    if f.mlx_version is None:
        on_linux = f.system == "Linux"
        return Check(
            "MLX backend",
            "fail",
            f"mlx does not load: {f.backend_error or 'unknown'}",
            'pip install "mlx[cpu]"  (or mlx[cuda] with an NVIDIA GPU)'
            if on_linux
            else "pip install --force-reinstall mlx",
        )
    where = f"mlx {f.mlx_version} on {f.device or '?'}"
    if f.device == "gpu":
        return Check("MLX backend", "ok", where)
    if f.system == "Darwin" and f.machine == "arm64":
        return Check(
            "MLX backend",
            "warn",
            where + " (Metal GPU not in use)",
            "check that Python is a native arm64 build, not running under Rosetta",
        )
    return Check(
        "MLX backend",
        "warn",
        where + ": generation will be slow",
        'on Linux with an NVIDIA GPU: pip install "mlx[cuda]"' if f.system == "Linux" else None,
    )


BLAS_FIX = (
    "sudo apt-get install libopenblas0-pthread (Debian/Ubuntu); "
    "sudo dnf install openblas-pthreads (Fedora); sudo pacman -S openblas (Arch)"
)


def _blas_check(f: DoctorFacts) -> Check:
    # On Linux the mlx-cpu wheel's reference BLAS multiplies 30-40x slower than OpenBLAS.
    if f.system == "Darwin":
        return Check("BLAS", "ok", f.blas.describe() if f.blas else "Accelerate (macOS)")
    if f.blas is None:
        return Check("BLAS", "info", "not measured: mlx does not load")
    found, load = f.blas.describe(), f.blas.load
    if f.blas.optimised:
        return Check("BLAS", "ok", found)
    if load is not None and load.outcome in ("failed", "too-late"):
        return Check(
            "BLAS",
            "warn",
            f"{found}; {load.path} was not loaded: {load.error}",
            f"set {ENV_CHOICE} to an optimised BLAS library (or unset it); " + BLAS_FIX,
        )
    if load is not None and load.outcome == "reference":
        return Check("BLAS", "info", f"{found} ({ENV_CHOICE}=reference)", f"unset {ENV_CHOICE}")
    if f.device == "gpu":  # the model runs on the GPU; only CPU-side work uses the BLAS
        return Check("BLAS", "info", found, BLAS_FIX)
    return Check("BLAS", "warn", found + " (OpenBLAS: 30-40x faster)", BLAS_FIX)


def _memory_check(f: DoctorFacts) -> Check:
    if f.total_memory <= 0:
        return Check("memory", "warn", "unknown", "models are judged without a memory limit")
    found_best = _recommended(f)
    best = found_best.entry if found_best else None
    detail = f"{format_bytes(f.total_memory)} total"
    if best is None:
        return Check(
            "memory",
            "fail",
            detail + ": no catalog model fits",
            "use a machine with more memory, or a small local model via --model PATH",
        )
    if f.total_memory < LOW_MEMORY:
        return Check(
            "memory",
            "warn",
            f"{detail}: only small models fit (best: {best.alias})",
            "close other apps; 16 GiB or more gives a much better experience",
        )
    found = f"{detail}; recommended model: {best.alias} ({format_bytes(best.size_bytes)})"
    if found_best is not None and (rule := found_best.speed_rule()):
        found += f"; {rule}"
    return Check("memory", "ok", found)


def _recommended(f: DoctorFacts) -> Recommendation | None:
    """The catalog model for this machine: fits its memory and suits its compute."""
    return recommendation(f.total_memory, compute=f.compute) if f.total_memory > 0 else None


def _recommended_entry(f: DoctorFacts) -> CatalogEntry | None:
    found = _recommended(f)
    return found.entry if found else None


def _install_fix(f: DoctorFacts) -> str:
    where = f.claude_install_dir or str(pinned_prefix())
    return (
        f"`mlx launch claude {INSTALL_FLAG}` installs "
        f"{CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION} into {where}"
    )


def _claude_check(f: DoctorFacts) -> Check:
    if f.claude_path is None:
        return Check(
            "claude", "fail", "Claude Code is not on PATH nor installed by mlx", _install_fix(f)
        )
    if f.claude_version is None:
        return Check(
            "claude", "warn", f"{f.claude_path} does not answer --version", _install_fix(f)
        )
    found = f"{f.claude_version} at {f.claude_path}"
    if not f.claude_version.startswith(CLAUDE_CODE_VERSION):
        found += f" (mlxlaunch is tested with {CLAUDE_CODE_VERSION})"
    return Check("claude", "ok", found)


def _node_checks(f: DoctorFacts) -> list[Check]:
    # The pinned Claude Code is a native binary: node runs only npm and its postinstall, so a
    # missing or old node matters for installing, or for a claude that is a node script.
    if f.node is None:
        return []
    problem = node_problem(f.node)
    if problem is None:
        version = format_version(f.node.version) if f.node.version else "?"
        return [Check("node", "ok", f"node {version} at {f.node.path}")]
    if f.claude_needs_node:
        return [Check("node", "fail", f"{problem}; {f.claude_path} runs under node", NODE_FIX)]
    if f.node.path is None and f.claude_path is not None:
        return [Check("node", "info", f"{problem}; needed only to install it", NODE_FIX)]
    if f.node.path is None:
        return [Check("node", "fail", f"{problem}; npm comes with it", NODE_FIX)]
    if f.node.too_old:
        problem += " (npm warns EBADENGINE and installs anyway)"
    return [Check("node", "warn", problem, NODE_FIX)]


def _model_checks(f: DoctorFacts) -> list[Check]:
    best = _recommended_entry(f)
    pull = f"mlx models pull {best.alias}" if best else "mlx models catalog"
    if not f.models:
        return [Check("models", "warn", "no models downloaded", pull)]
    checks = []
    for model in f.models:
        name = f"model {model.name}"
        if model.problems:
            checks.append(
                Check(
                    name,
                    "fail",
                    "; ".join(model.problems),
                    f"mlx models rm {model.name}, then {pull}",
                )
            )
            continue
        fit = memory_fit(model.weights_bytes, f.total_memory)
        found = fit.describe()
        if model.context_window and f.total_memory > 0:  # the window a launch advertises
            window = model.context_window
            here = windows_here(window, model.weights_bytes, model.kv, f.total_memory)
            found += "; " + describe_windows(here, window)
        if fit.fits:
            checks.append(Check(name, "ok", found))
        else:
            checks.append(Check(name, "warn", found, f"pick a smaller model: {pull}"))
    return checks


def _small_model_checks(f: DoctorFacts) -> list[Check]:
    """The small model set for the haiku tier: downloaded, and fitting beside the main model
    (both count: they are served by one process)."""
    if not f.small_model:
        return []
    by_name = {m.name: m for m in f.models}
    small = by_name.get(f.small_model)
    name = "haiku tier"
    if small is None:
        detail = f"default-small-model {f.small_model} is not downloaded"
        fix = f"mlx models pull {f.small_model}"
        return [Check(name, "warn", detail + " (the main model serves the tier)", fix)]
    main = by_name.get(f.default_model or "") or max(
        (m for m in f.models if m is not small), key=lambda m: m.weights_bytes, default=None
    )
    if main is None:
        return [Check(name, "ok", f"{small.name} (no main model downloaded beside it)")]
    fit = memory_fit(main.weights_bytes + small.weights_bytes, f.total_memory)
    detail = f"{small.name} beside {main.name}: {fit.describe()}"
    if fit.fits:
        return [Check(name, "ok", detail)]
    return [Check(name, "warn", detail, "mlx models recommend --small")]


def _search_check(f: DoctorFacts) -> Check:
    if f.search_problem:
        return Check("web search", "warn", f.search_problem, SEARCH_FIX)
    if f.search is None:
        return Check("web search", "info", "not configured (agents' searches say so)", SEARCH_FIX)
    return Check("web search", "ok", f.search)


SEARCH_FIX = "mlx config set search.backend searxng && mlx config set search.url http://HOST:PORT"


def _disk_check(f: DoctorFacts) -> Check:
    best = _recommended_entry(f)
    needed = (best.size_bytes if best else 0) + DISK_HEADROOM
    detail = f"{format_bytes(f.free_disk)} free at {f.models_dir}"
    if f.free_disk < needed:
        what = f"{best.alias} needs {format_bytes(best.size_bytes)}" if best else "low space"
        return Check(
            "disk", "warn", f"{detail} ({what})", "free space, or set HF_HUB_CACHE to a bigger disk"
        )
    return Check("disk", "ok", detail)


def _server_check(f: DoctorFacts) -> Check:
    if not f.servers:
        return Check("server", "info", "none running", "start one: mlx launch claude")
    lines = [f"{s.url} ({s.kind}, {s.model}, pid {s.pid})" for s in f.servers]
    return Check("server", "ok", "; ".join(lines))


def run_checks(facts: DoctorFacts) -> list[Check]:
    """All checks in report order."""
    return [
        _backend_check(facts),
        _blas_check(facts),
        _memory_check(facts),
        _claude_check(facts),
        *_node_checks(facts),
        *_model_checks(facts),
        *_small_model_checks(facts),
        _disk_check(facts),
        _server_check(facts),
        _search_check(facts),
    ]


def worst(checks: list[Check]) -> Status:
    """The most serious status among `checks` (decides the exit code)."""
    statuses = {c.status for c in checks}
    if "fail" in statuses:
        return "fail"
    return "warn" if "warn" in statuses else "ok"


def _mlx_facts() -> tuple[str | None, str | None, str | None]:
    try:
        import mlx.core as mx
    except Exception as exc:  # a broken install raises ImportError or OSError
        return None, None, str(exc)
    return str(getattr(mx, "__version__", "?")), str(mx.default_device().type.name), None


def _free_disk(directory: Path) -> int:
    # The cache may not exist yet: measure the nearest existing parent.
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def _local_models() -> tuple[ModelFact, ...]:
    from mlxlaunch.store.inventory import list_models

    return tuple(
        ModelFact(
            m.name,
            m.facts.weights_bytes,
            tuple(m.facts.problems()),
            m.facts.context_window,
            m.facts.kv,
        )
        for m in list_models()
    )


def gather_facts(
    *,
    claude_bin: str | None = None,
    models: Callable[[], tuple[ModelFact, ...]] = _local_models,
) -> DoctorFacts:
    """Read the facts of this machine (mlx, memory, claude, node, models, disk, servers)."""
    from mlxlaunch.errors import ClaudeNotFound
    from mlxlaunch.store.paths import hub_cache_dir

    version, device, error = _mlx_facts()
    try:
        claude: Path | None = find_claude(claude_bin)
    except ClaudeNotFound:
        claude = None
    cache = hub_cache_dir()
    settings = load_config()
    search, search_problem = _search_facts(settings)
    return DoctorFacts(
        system=platform.system(),
        machine=platform.machine(),
        mlx_version=version,
        device=device,
        backend_error=error,
        total_memory=system_memory_bytes(),
        claude_path=str(claude) if claude else None,
        claude_version=claude_version(claude) if claude else None,
        models=models(),
        models_dir=str(cache),
        free_disk=_free_disk(cache),
        servers=tuple(running_servers()),
        blas=blas_report() if version is not None else None,
        claude_install_dir=str(pinned_prefix()),
        claude_needs_node=claude is not None and runs_under_node(claude),
        node=node_facts(),
        cpu_count=os.cpu_count() or 1,
        default_model=settings.get("default-model"),
        small_model=settings.get("default-small-model") or settings.get("small-model"),
        search=search,
        search_problem=search_problem,
    )


def _search_facts(settings: UserConfig) -> tuple[str | None, str | None]:
    """(the search backend's description or None, why it cannot serve or None)."""
    try:
        backend = configured_backend(settings)
    except ConfigError as exc:
        return None, str(exc)
    return (backend.describe() if backend else None), None


# --- several machines: `mlx doctor --hosts …` -------------------------------------------


def _versions_of(host: HostFacts) -> str:
    return ", ".join(f"{name} {host.versions.get(name) or 'missing'}" for name in MATCHED_PACKAGES)


def _host_check(host: HostFacts, preflight: Preflight) -> Check:
    name = f"host {host.host}"
    if not host.reachable:
        fix = f"make `ssh {host.host}` work without a password (ssh-copy-id); install mlxlaunch"
        return Check(name, "fail", f"unreachable: {host.error}", fix)
    ranks = [str(r) for r, h in enumerate(preflight.cluster.hosts) if h == host.host]
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {','.join(ranks)}", _versions_of(host)]
    if host.available_memory is not None and host.total_memory is not None:
        free, total = format_bytes(host.available_memory), format_bytes(host.total_memory)
        parts.append(f"{free} of {total} free")
    backend = preflight.cluster.backend
    parts.append(f"{backend}: {'yes' if host.backends.get(backend) else 'no'}")
    if host.model is not None:
        found = host.model.found
        parts.append(
            f"model: {format_bytes(host.model.weight_bytes)}" if found else "model: missing"
        )
    problems = preflight.about(host.host)
    return Check(
        name,
        "fail" if problems else "ok",
        "; ".join(parts),
        " ".join(p.text for p in problems) or None,
    )


def cluster_checks(preflight: Preflight, link: LinkFigures | None) -> list[Check]:
    """The cluster section: a check per host, then versions, model files, shards and link."""
    checks = [_host_check(host, preflight) for host in preflight.hosts]
    reached = [h for h in preflight.hosts if h.reachable]
    if mismatched := preflight.of_kind("versions"):
        detail = " ".join(p.text for p in mismatched)
        checks.append(Check("versions", "fail", detail, "install one version on every host"))
    elif reached:
        where = (
            "every host"
            if len(reached) == len(preflight.hosts)
            else f"the {len(reached)} reachable of {len(preflight.hosts)} hosts"
        )
        checks.append(Check("versions", "ok", f"alike on {where}: {_versions_of(reached[0])}"))
    if preflight.model is not None:
        checks.append(_model_files_check(preflight))
        checks.append(_shard_check(preflight))
    checks.append(_link_check(link))
    return checks


def _model_files_check(preflight: Preflight) -> Check:
    if differ := preflight.of_kind("model-differs"):
        return Check("model files", "fail", differ[0].text, "copy one snapshot to every host")
    alike = [h for h in preflight.hosts if h.model and h.model.found]
    if len(alike) < len(preflight.hosts):
        detail = f"compared on {len(alike)} of {len(preflight.hosts)} hosts (see above)"
        return Check("model files", "warn", detail)
    count = len(alike)
    return Check("model files", "ok", f"alike on the {count} host{'s' if count != 1 else ''}")


def _shard_check(preflight: Preflight) -> Check:
    plan = preflight.plan
    if plan is None:
        return Check("shard plan", "info", "; ".join(preflight.notes) or "not checked")
    if plan.parallel is None:
        return Check("shard plan", "fail", plan.describe(), "pick another --parallel or host count")
    if short := preflight.of_kind("memory"):
        detail = plan.describe() + ": " + " ".join(p.text for p in short)
        return Check("shard plan", "fail", detail, "free memory, add hosts, or quantize more")
    return Check("shard plan", "ok", plan.describe())


def _link_check(link: LinkFigures | None) -> Check:
    if link is None:
        return Check("link", "info", "not measured: the cluster cannot start (see above)")
    if link.error is not None:
        return Check("link", "warn", link.describe(), "check the hosts' network and firewall")
    return Check("link", "ok", link.describe())
