"""Checks before a cluster starts: every host reachable and alike, and the model shardable.

`check_cluster(cluster, model)` probes each host (`cluster.probe` over ssh, in parallel), plans
the sharding with mlx-lm's own rules (`shard_plan`), and lists each problem as a sentence that
says what is wrong and how to fix it; `Preflight.refuse()` turns them into one ConfigError.

Design: a cluster that starts with mismatched mlx versions, different model files or a shard
that does not fit fails minutes later, on some rank, with a traceback about shapes or a lost
peer; here the same facts are read in about a second and refused with the reason. The shard
plan asks mlx-lm itself: it builds the architecture lazily (no weight is read or evaluated) and
runs the model's own `shard()` and `model.pipeline()` against a stand-in group, so what they
check (every sharded dimension divisible by the rank count, enough layers) is checked exactly;
on top, the head counts must divide, which `shard()` does not check (it floors them).
"""

from __future__ import annotations

import inspect
import json
import re
import struct
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlxlaunch.cluster.hosts import Cluster, Parallel, is_local, ssh_argv
from mlxlaunch.cluster.remote_text import printable
from mlxlaunch.errors import ConfigError
from mlxlaunch.store.memory import format_bytes

Mode = Literal["tensor", "pipeline"]
PROBE_MODULE = "mlxlaunch.cluster.probe"
PROBE_TIMEOUT = 30.0  # seconds per host: ssh's ConnectTimeout is 5, the probe itself < 1
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5")
SSH_UNREACHABLE = 255  # ssh's own exit status when it cannot connect or authenticate
MATCHED_PACKAGES = ("mlx", "mlx-lm", "mlxlaunch")
INDEX_FILE = "model.safetensors.index.json"
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # as sharded_load matches checkpoint layers


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


# --- the shard plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPlan:
    """How `size` ranks split a model, or why they cannot.

    `parallel` is None when refused (`refusal` says why); `rank_bytes[r]` is what rank r holds
    of the weights; `layers[r]` is rank r's [start, end) for pipeline parallelism (as mlx-lm's
    `pipeline()` splits them: rank 0 runs the last layers).
    """

    size: int
    asked: Parallel
    parallel: Mode | None
    model_type: str
    weight_bytes: int
    rank_bytes: tuple[int, ...] = ()
    layers: tuple[tuple[int, int], ...] = ()
    tensor_problem: str | None = None
    pipeline_problem: str | None = None

    @property
    def refusal(self) -> str | None:
        """Why the asked mode cannot work, as a sentence; None when the plan stands."""
        if self.parallel is not None:
            return None
        reasons = {
            "tensor": self.tensor_problem,
            "pipeline": self.pipeline_problem,
        }.get(self.asked) or f"{self.tensor_problem} {self.pipeline_problem}"
        how = "" if self.asked == "auto" else f" with {self.asked} parallelism"
        return f"{self.model_type} cannot be sharded over {self.size} ranks{how}: {reasons}"

    def describe(self) -> str:
        """One line: the mode and what each rank holds."""
        if self.parallel is None:
            return f"refused: {self.refusal}"
        each = ", ".join(format_bytes(b) for b in self.rank_bytes)
        text = f"{self.parallel} parallel over {self.size} ranks ({each} per rank)"
        if self.layers:
            text += "; layers " + ", ".join(
                f"r{r}: {a}-{b - 1}" for r, (a, b) in enumerate(self.layers)
            )
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "asked": self.asked,
            "parallel": self.parallel,
            "model_type": self.model_type,
            "weight_bytes": self.weight_bytes,
            "rank_bytes": list(self.rank_bytes),
            "layers": [list(r) for r in self.layers],
            "tensor_problem": self.tensor_problem,
            "pipeline_problem": self.pipeline_problem,
            "refusal": self.refusal,
        }


class _PlanGroup:
    """Stands in for an `mx.distributed.Group` of `size` ranks: `shard()` and `pipeline()`
    only ask its size and rank while they build the sharded modules (no collective runs)."""

    def __init__(self, size: int, rank: int = 0) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def _lazy_model(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The architecture of `model_dir`, built as mlx-lm's `load_model` builds it but without
    weights: its parameters are lazy arrays that are never evaluated."""
    import mlx.nn as nn
    from mlx_lm.utils import load_config, load_model

    config = load_config(model_dir)
    # The model-class lookup load_model itself uses (its default), so remaps stay mlx-lm's.
    classes = inspect.signature(load_model).parameters["get_model_classes"].default
    model_class, args_class = classes(config=config)
    model = model_class(args_class.from_dict(config))
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and "bits" in quantization:
        # Sharding a quantized layer splits its packed weight and scales: quantize the same
        # way so the divisibility checks see the shapes the real load makes.
        group = int(quantization.get("group_size", 64))
        nn.quantize(
            model,
            group_size=group,
            bits=int(quantization["bits"]),
            mode=quantization.get("mode", "affine"),
            class_predicate=lambda _, m: (
                hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0
            ),
        )
    return model, config


def _parameter_count(model: Any) -> int:
    from mlx.utils import tree_flatten

    leaves: Any = tree_flatten(model.parameters())  # a list of (path, array) pairs
    return sum(int(array.size) for _, array in leaves)


def _head_counts(config: dict[str, Any]) -> tuple[int | None, int | None]:
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    heads = config.get("num_attention_heads", text.get("num_attention_heads"))
    kv_heads = config.get("num_key_value_heads", text.get("num_key_value_heads", heads))
    return heads, kv_heads


def _tensor_problem(
    model: Any, config: dict[str, Any], size: int, weights: int
) -> tuple[str | None, tuple[int, ...]]:
    model_type = config.get("model_type", "?")
    if not hasattr(model, "shard"):
        return f"mlx-lm's {model_type} has no tensor parallelism (its Model has no shard()).", ()
    heads, kv_heads = _head_counts(config)
    for count, what in ((heads, "attention"), (kv_heads, "key/value")):
        if isinstance(count, int) and count % size:
            return (
                f"tensor parallelism splits the heads over the ranks, and {count} {what} heads "
                f"do not divide by {size} ranks.",
                (),
            )
    before = _parameter_count(model)
    try:
        model.shard(_PlanGroup(size))
    except Exception as exc:  # mlx's shard_linear raises ValueError on a dimension that won't split
        return f"mlx-lm's shard() for {model_type} fails on {size} ranks: {exc}", ()
    share = _parameter_count(model) / before if before else 1.0
    return None, (round(weights * share),) * size


def _tensor_bytes(model_dir: Path) -> dict[str, tuple[str, int]]:
    """Each checkpoint tensor's file and byte size, from the safetensors headers (no data read)."""
    sizes: dict[str, tuple[str, int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if isinstance(info, dict) and "data_offsets" in info:
                start, end = info["data_offsets"]
                sizes[name] = (path.name, int(end) - int(start))
    return sizes


def _pipeline_problem(
    model: Any, model_dir: Path, config: dict[str, Any], size: int, weights: int
) -> tuple[str | None, tuple[int, ...], tuple[tuple[int, int], ...]]:
    model_type = config.get("model_type", "?")
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "pipeline"):
        return f"mlx-lm's {model_type} has no pipeline parallelism (no model.pipeline()).", (), ()
    if not (model_dir / INDEX_FILE).is_file():
        return (
            f"pipeline parallelism picks each rank's weights from {INDEX_FILE}, and "
            f"{model_dir} has none; convert the model with mlx_lm.convert to write one.",
            (),
            (),
        )
    layers = list(inner.layers)
    if len(layers) < size:
        return f"{len(layers)} layers cannot be split over {size} ranks.", (), ()
    ranges = []
    try:
        for rank in range(size):  # mlx-lm's own split, asked once per rank
            inner.layers = list(layers)
            inner.pipeline(_PlanGroup(size, rank))
            ranges.append((int(inner.start_idx), int(inner.end_idx)))
    except Exception as exc:
        return f"mlx-lm's pipeline() for {model_type} fails on {size} ranks: {exc}", (), ()
    finally:
        inner.layers = layers
    try:
        tensors = _tensor_bytes(model_dir)
    except (OSError, ValueError, struct.error):
        tensors = {}
    found_layers = {int(m.group(1)) for n in tensors if (m := LAYER.search(n))}
    if tensors and (missing := sorted(set(range(len(layers))) - found_layers)):
        return f"the checkpoint has no weights for layers {missing}.", (), ()
    if not tensors:  # headers unreadable: assume layers of equal size
        return None, tuple(weights * (b - a) // len(layers) for a, b in ranges), tuple(ranges)
    rank_bytes = []
    for start, end in ranges:
        held = 0
        for name, (_, nbytes) in tensors.items():
            m = LAYER.search(name)
            if m is None or start <= int(m.group(1)) < end:  # embeddings, norm, head: on all
                held += nbytes
        rank_bytes.append(held)
    return None, tuple(rank_bytes), tuple(ranges)


def shard_plan(model_dir: Path, size: int, parallel: Parallel = "auto") -> ShardPlan:
    """How `size` ranks shard the model in `model_dir`, by mlx-lm's rules (see the module
    docstring): "auto" takes tensor parallelism where it works, else pipeline; an explicit
    mode that cannot work, or neither, gives a plan with `parallel=None` and a `refusal`."""
    weights = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    model_dir = Path(model_dir)
    try:
        model, config = _lazy_model(model_dir)
    except Exception as exc:
        reason = f"mlx-lm cannot build the model in {model_dir}: {exc}"
        return ShardPlan(size, parallel, None, "?", weights, (), (), reason, reason)
    model_type = str(config.get("model_type", "?"))
    # Pipeline first: its check restores the layers, while shard() replaces modules in place.
    pipe_problem, pipe_bytes, ranges = _pipeline_problem(model, model_dir, config, size, weights)
    tensor_problem, tensor_bytes = _tensor_problem(model, config, size, weights)
    plan = ShardPlan(
        size, parallel, None, model_type, weights, (), (), tensor_problem, pipe_problem
    )
    if parallel in ("auto", "tensor") and tensor_problem is None:
        return _with(plan, "tensor", tensor_bytes, ())
    if parallel in ("auto", "pipeline") and pipe_problem is None:
        return _with(plan, "pipeline", pipe_bytes, ranges)
    return plan


def _with(
    plan: ShardPlan, mode: Mode, rank_bytes: tuple[int, ...], layers: tuple[tuple[int, int], ...]
) -> ShardPlan:
    return ShardPlan(
        plan.size, plan.asked, mode, plan.model_type, plan.weight_bytes, rank_bytes, layers,
        plan.tensor_problem, plan.pipeline_problem,
    )  # fmt: skip


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
            plan = shard_plan(directory, cluster.size, parallel or cluster.parallel)
            if plan.refusal:
                other = "another --parallel mode or " if plan.asked != "auto" else ""
                text = f"{plan.refusal} Choose {other}another number of ranks."
                found.append(Problem("unshardable", text))
            else:
                found += memory_problems(cluster, hosts, plan)
    return Preflight(cluster, model, tuple(hosts), plan, tuple(found), tuple(notes))
