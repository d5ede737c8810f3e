"""Checks before a cluster starts: every host reachable and alike, and the model shardable.

`check_cluster(cluster, model)` probes each host (`cluster.probe` over ssh, in parallel), plans
the sharding with mlx-lm's own rules (`shard_plan`), and lists each problem as a sentence that
says what is wrong and how to fix it; `Preflight.refuse()` turns them into one ConfigError.

Design: a cluster that starts with mismatched mlx versions, different model files or a shard
that does not fit fails minutes later, on some rank, with a traceback about shapes or a lost
peer; here the same facts are read in about a second and refused with the reason. The shard
plan asks mlx-lm itself, through the caller's `probe_shards` (the engine's runtime: this room
reads no mlx-lm): it builds the architecture lazily (no weight is read or evaluated) and runs
the model's own `shard()` and `model.pipeline()` against a stand-in group, so what they check
(every sharded dimension divisible by the rank count, enough layers) is checked exactly; on
top, the head counts must divide, which `shard()` does not check (it floors them). Here: the
bytes each rank holds, from the safetensors headers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlxlaunch.cluster.hosts import Cluster, Parallel, is_local, ssh_argv
from mlxlaunch.cluster.remote_text import printable
from mlxlaunch.cluster.shard_plan import Mode, ProbeShards, ShardPlan, shard_plan
from mlxlaunch.errors import ConfigError
from mlxlaunch.store.memory import format_bytes

PROBE_MODULE = "mlxlaunch.cluster.probe"
PROBE_TIMEOUT = 30.0  # seconds per host: ssh's ConnectTimeout is 5, the probe itself < 1
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5")
SSH_UNREACHABLE = 255  # ssh's own exit status when it cannot connect or authenticate
MATCHED_PACKAGES = ("mlx", "mlx-lm", "mlxlaunch")


# --- one host ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOnHost:
    """The model as one host has it (or why it does not)."""

    found: bool
    path: str | None = None
    weight_bytes: int = 0
    fingerprint: str | None = None
    error: str | None = None
    test_model: bool = False  # a built-in test model: built on first use, never downloaded


@dataclass(frozen=True)
class HostFacts:
    """What the probe reported from one host; `reachable` False carries only `error`."""

    host: str
    reachable: bool
    error: str | None = None
    hostname: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    total_memory: int | None = None
    available_memory: int | None = None
    backends: dict[str, bool] = field(default_factory=dict)
    model: ModelOnHost | None = None
    errors: tuple[str, ...] = ()

    @classmethod
    def from_probe(cls, host: str, data: dict[str, Any]) -> HostFacts:
        """The facts in the probe's JSON (fields it lacks stay empty).

        The answer is another machine's data: each field must have its type, and its text is
        made printable (cluster/remote_text.py) before anything shows it.

        Raises:
            ValueError: a field of the wrong type, named.
        """
        memory = _object(data.get("memory"), "memory")
        model = data.get("model")
        versions = _object(data.get("versions"), "versions")
        backends = _object(data.get("backends"), "backends")
        return cls(
            host=host,
            reachable=True,
            hostname=_text(data.get("hostname"), "hostname"),
            versions={printable(k, 100): _text(v, f"versions.{k}") for k, v in versions.items()},
            total_memory=_count(memory.get("total"), "memory.total"),
            available_memory=_count(memory.get("available"), "memory.available"),
            backends={printable(k, 100): _flag(v, f"backends.{k}") for k, v in backends.items()},
            model=None if model is None else _model_on_host(_object(model, "model")),
            errors=tuple(_text(e, "errors") or "" for e in _list(data.get("errors"), "errors")),
        )


def _model_on_host(model: dict[str, Any]) -> ModelOnHost:
    return ModelOnHost(
        found=_flag(model.get("found"), "model.found"),
        path=_text(model.get("path"), "model.path"),
        weight_bytes=_count(model.get("weight_bytes"), "model.weight_bytes") or 0,
        fingerprint=_text(model.get("fingerprint"), "model.fingerprint"),
        error=_text(model.get("error"), "model.error"),
        test_model=_flag(model.get("test_model"), "model.test_model"),
    )


# Readers of one field of a probe's answer: its value if it has the field's type (None when
# absent), else a ValueError that names the field.


def _wrong(what: str, value: Any, wanted: str) -> ValueError:
    return ValueError(f"{printable(what, 100)} is {type(value).__name__}, not {wanted}")


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _wrong(what, value, "an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _wrong(what, value, "a list")
    return value


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong(what, value, "text")
    return printable(value)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _wrong(what, value, "a byte count")
    return value


def _flag(value: Any, what: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _wrong(what, value, "true or false")
    return value


def probe_command(host: str, model: str | None, *, python: str | None = None) -> list[str]:
    """The argv that runs the probe for `host`: directly here, else through ssh (no password
    prompt: BatchMode), with the same interpreter path as here unless `python` is given."""
    command = [python or sys.executable, "-m", PROBE_MODULE]
    if model is not None:
        command.append(f"--model={model}")  # one word: a name that starts with - stays a value
    if is_local(host):
        return command
    return ssh_argv(host, command, SSH_OPTIONS)


def probe_host(
    host: str, model: str | None, *, python: str | None = None, timeout: float = PROBE_TIMEOUT
) -> HostFacts:
    """Run the probe on `host` and read its JSON; every failure becomes an unreachable fact."""
    argv = probe_command(host, model, python=python)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return HostFacts(host, False, f"no answer within {timeout:.0f} s")
    except OSError as exc:
        return HostFacts(host, False, f"{argv[0]}: {exc.strerror or exc}")
    stderr = done.stderr.strip().splitlines()
    last = printable(stderr[-1], 300) if stderr else f"exit status {done.returncode}"
    if not is_local(host) and done.returncode == SSH_UNREACHABLE:
        return HostFacts(host, False, f"ssh failed: {last}")
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            try:
                return HostFacts.from_probe(host, data)
            except ValueError as exc:  # another mlxlaunch there, or not mlxlaunch at all
                return HostFacts(host, False, f"its probe answered malformed JSON ({exc})")
    if "No module named" in done.stderr:
        last = f"{python or sys.executable} there cannot import mlxlaunch ({last})"
    return HostFacts(host, False, f"the probe gave no answer: {last}")


def distinct_hosts(cluster: Cluster) -> list[str]:
    """Each host once, in rank order (a host may run several ranks)."""
    return list(dict.fromkeys(cluster.hosts))


def probe_hosts(
    cluster: Cluster,
    model: str | None,
    *,
    python: str | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> list[HostFacts]:
    """The probe's facts from each distinct host of `cluster`, probed in parallel, in rank
    order; a host that cannot be reached (or answers no JSON) gives `reachable=False`."""
    hosts = distinct_hosts(cluster)
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        return list(pool.map(lambda h: probe_host(h, model, python=python, timeout=timeout), hosts))


# --- the whole cluster ------------------------------------------------------------------


ProblemKind = Literal[
    "unreachable", "broken", "versions", "model-missing", "model-differs", "backend", "memory",
    "unshardable",
]  # fmt: skip


@dataclass(frozen=True)
class Problem:
    """One reason the cluster cannot start: a sentence saying what and how to fix it, and the
    hosts it is about (none: the whole cluster)."""

    kind: ProblemKind
    text: str
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preflight:
    """Everything checked before the ranks start, and what stands in the way."""

    cluster: Cluster
    model: str | None
    hosts: tuple[HostFacts, ...]
    plan: ShardPlan | None
    findings: tuple[Problem, ...]
    notes: tuple[str, ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        """Each problem as a full sentence (what is wrong, and how to fix it)."""
        return tuple(p.text for p in self.findings)

    @property
    def parallel(self) -> Mode | None:
        """The resolved mode ("tensor" or "pipeline"); None without a model or when refused."""
        return self.plan.parallel if self.plan else None

    @property
    def ok(self) -> bool:
        return not self.findings

    def about(self, host: str) -> list[Problem]:
        """The problems that name `host`."""
        return [p for p in self.findings if host in p.hosts]

    def of_kind(self, *kinds: ProblemKind) -> list[Problem]:
        return [p for p in self.findings if p.kind in kinds]

    def refuse(self) -> None:
        """Raise the problems, if any, as one ConfigError (exit 2).

        Raises:
            ConfigError: at least one problem was found.
        """
        if self.findings:
            count = len(self.findings)
            raise ConfigError(
                f"the cluster cannot start ({count} problem{'s' if count > 1 else ''}):\n"
                + "\n".join(f"- {p}" for p in self.problems)
            )


def _joined(items: Sequence[str]) -> str:
    return ", ".join(items)


def reachability_problems(hosts: Sequence[HostFacts]) -> list[Problem]:
    """A host the probe could not run on, or whose mlx does not load."""
    problems = []
    for h in hosts:
        if not h.reachable:
            text = (
                f"Host {h.host} cannot be checked: {h.error}. Make `ssh {h.host}` work without "
                "a password prompt (ssh-copy-id) and install mlxlaunch there at the same path."
            )
            problems.append(Problem("unreachable", text, (h.host,)))
        else:
            problems += [
                Problem("broken", f"Host {h.host}: {e}; reinstall mlx there.", (h.host,))
                for e in h.errors
            ]
    return problems


def version_problems(hosts: Sequence[HostFacts]) -> list[Problem]:
    """One problem per package whose version differs between reachable hosts."""
    problems = []
    for package in MATCHED_PACKAGES:
        seen: dict[str, list[str]] = {}
        for h in hosts:
            if h.reachable:
                seen.setdefault(h.versions.get(package) or "not installed", []).append(h.host)
        if len(seen) > 1:
            where = "; ".join(f"{v} on {_joined(names)}" for v, names in seen.items())
            first = next(iter(seen))
            text = (
                f"{package} differs across hosts ({where}): ranks must run the same code; "
                f"install one version everywhere (e.g. pip install {package}=={first})."
            )
            odd = tuple(name for names in list(seen.values())[1:] for name in names)
            problems.append(Problem("versions", text, odd))
    return problems


def model_problems(hosts: Sequence[HostFacts], model: str) -> list[Problem]:
    """A host without the model, and copies whose files differ."""
    problems = []
    prints: dict[str, list[str]] = {}
    for h in hosts:
        if not h.reachable or h.model is None:
            continue
        if not h.model.found:
            fix = (
                f"build it there once (ssh {h.host} mlx serve --model {model}, then stop it)"
                if h.model.test_model
                else f"download it there (ssh {h.host} mlx models pull {model}) or copy it over"
            )
            text = f"Model {model!r} is not on host {h.host} ({h.model.error}); {fix}."
            problems.append(Problem("model-missing", text, (h.host,)))
        elif h.model.fingerprint:
            prints.setdefault(h.model.fingerprint, []).append(h.host)
    if len(prints) > 1:
        groups = " / ".join(_joined(names) for names in prints.values())
        text = (
            f"The files of model {model!r} differ across hosts (file names, sizes or "
            f"config.json; alike: {groups}); copy one snapshot to every host."
        )
        odd = tuple(name for names in list(prints.values())[1:] for name in names)
        problems.append(Problem("model-differs", text, odd))
    return problems


def backend_problems(hosts: Sequence[HostFacts], backend: str) -> list[Problem]:
    """Hosts whose mlx cannot start the cluster's backend."""
    missing = [h.host for h in hosts if h.reachable and h.backends and not h.backends.get(backend)]
    if not missing:
        return []
    fix = (
        "JACCL needs macOS 26.2+ with RDMA over Thunderbolt 5 enabled; or use --backend ring"
        if backend == "jaccl"
        else "reinstall mlx there"
    )
    text = f"mx.distributed's {backend} backend is not available on {_joined(missing)}; {fix}."
    return [Problem("backend", text, tuple(missing))]


def memory_problems(cluster: Cluster, hosts: Sequence[HostFacts], plan: ShardPlan) -> list[Problem]:
    """A host whose ranks' shards exceed its available memory."""
    problems = []
    for h in hosts:
        if not h.reachable or h.available_memory is None or not plan.rank_bytes:
            continue
        ranks = [r for r, name in enumerate(cluster.hosts) if name == h.host]
        need = sum(plan.rank_bytes[r] for r in ranks)
        if need > h.available_memory:
            label = "rank" if len(ranks) == 1 else "ranks"
            text = (
                f"Host {h.host} has {format_bytes(h.available_memory)} available, and its "
                f"{label} {_joined([str(r) for r in ranks])} need {format_bytes(need)} of "
                "weights; free memory there, add hosts, or pick a smaller quantization."
            )
            problems.append(Problem("memory", text, (h.host,)))
    return problems


def _local_model_dir(model: str) -> Path | None:
    from mlxlaunch.cluster.probe import resolve_local

    try:
        return resolve_local(model)
    except Exception:  # not on this machine: the plan is left out
        return None


def check_cluster(
    cluster: Cluster,
    model: str | None,
    parallel: Parallel | None = None,
    *,
    probe_shards: ProbeShards,
    python: str | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> Preflight:
    """Probe every host and plan the shards; `parallel` defaults to the cluster's own.

    The plan is made on this machine, from its copy of the model; for a model that is not here
    the plan is left out with a note (shard sizes then go unchecked, `parallel` is None).
    """
    hosts = probe_hosts(cluster, model, python=python, timeout=timeout)
    found = reachability_problems(hosts) + version_problems(hosts)
    found += backend_problems(hosts, cluster.backend)
    notes: list[str] = []
    plan: ShardPlan | None = None
    if model is not None:
        found += model_problems(hosts, model)
        directory = _local_model_dir(model)
        if directory is None:
            notes.append(f"shard plan not checked: model {model!r} is not on this machine")
        else:
            asked = parallel or cluster.parallel
            plan = shard_plan(directory, cluster.size, asked, probe_shards=probe_shards)
            if plan.refusal:
                other = "another --parallel mode or " if plan.asked != "auto" else ""
                text = f"{plan.refusal} Choose {other}another number of ranks."
                found.append(Problem("unshardable", text))
            else:
                found += memory_problems(cluster, hosts, plan)
    return Preflight(cluster, model, tuple(hosts), plan, tuple(found), tuple(notes))
