"""How `mlx models list/catalog/info/recommend` show models: tables, blocks for narrow
consoles, JSON.
Values are in words a person reads ("unknown", "yes", "4.0B", "3 h ago"), never Python's
`None`/`True`; the JSON keeps the raw values, under stable keys.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from mlxlaunch.cli.layout import Cell, Column, Record, print_lines, print_report, record_blocks
from mlxlaunch.errors import ConfigError
from mlxlaunch.store import CatalogEntry, LocalModel
from mlxlaunch.store.catalog import (
    SMALL_MODEL_MAX_BYTES,
    catalog_entry,
    recommendation,
    small_recommendation,
)
from mlxlaunch.store.compute import Compute, this_machine
from mlxlaunch.store.facts import read_chat_template, template_features
from mlxlaunch.store.generation_config import describe_sampling
from mlxlaunch.store.memory import describe_windows, format_bytes, memory_fit

LIST_COLUMNS = (
    Column("name"),
    Column("repo"),
    Column("rev"),
    Column("size", justify="right"),
    Column("bits"),
    Column("params", justify="right"),
    Column("context", justify="right"),
    Column("tools"),
    Column("thinking"),
    Column("last used"),
)
CATALOG_COLUMNS = (
    Column("alias"),
    Column("repo"),
    Column("kind"),
    Column("params"),
    Column("bits", justify="right"),
    Column("size", justify="right"),
    Column("context", justify="right"),
    Column("memory", justify="right"),
    Column("note", wrap=True),
)
CATALOG_TITLE = "Catalog (mlx models pull ALIAS)"


def yes_no(value: bool | None) -> str:
    """A flag in words."""
    return "unknown" if value is None else "yes" if value else "no"


def params(n: int | None) -> str:
    """A parameter count as people say it: 4.0B, 350.0M."""
    if not n:
        return "unknown"
    return f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def ago(ts: float | None, now: float | None = None) -> str:
    """How long ago `ts` (unix seconds) was, in the largest fitting unit."""
    if not ts:
        return "never"
    minutes = ((time.time() if now is None else now) - ts) / 60
    for limit, unit, div in ((60, "min", 1), (48 * 60, "h", 60), (float("inf"), "d", 1440)):
        if minutes < limit:
            return f"{minutes / div:.0f} {unit} ago"
    return "unknown"


def _tokens(n: int | None) -> str:
    return f"{n:,}" if n else "unknown"


def _name(model: LocalModel) -> Text:
    name = Text(model.name, style="bold")
    if model.shard is not None:  # only some pipeline ranks' files, all there: not broken
        name.append(f" (shard {model.shard})", style="cyan")
    elif not model.complete:
        name.append(" (incomplete)", style="yellow")
    return name


def _list_values(m: LocalModel) -> list[str]:
    f = m.facts
    return [
        m.repo_id or str(m.path),
        (m.revision or "")[:8] or "local",
        format_bytes(m.size_on_disk),
        str(f.quant_bits) if f.quant_bits else (f.dtype or "unknown"),
        params(f.param_count),
        _tokens(f.context_window),
        f.tool_format or "none",
        yes_no(f.thinking),
        ago(m.last_used),
    ]


def print_local_models(console: Console, models: Sequence[LocalModel]) -> None:
    """`mlx models list`: a table when it fits `console`, else a block per model."""
    rows: list[list[Cell]] = [[_name(m), *_list_values(m)] for m in models]
    labels = [c.header for c in LIST_COLUMNS[1:]]
    records = [Record(_name(m), tuple(zip(labels, _list_values(m), strict=True))) for m in models]
    print_report(console, LIST_COLUMNS, rows, records, title="Local MLX models")


def _catalog_values(e: CatalogEntry) -> list[str]:
    return [
        e.kind,
        e.params,
        str(e.bits),
        format_bytes(e.size_bytes),
        f"{e.context_window:,}",
        format_bytes(e.memory_bytes),
        e.note,
    ]


def print_catalog(console: Console, entries: Sequence[CatalogEntry]) -> None:
    """`mlx models catalog`: a table when it fits `console`, else a block per alias."""
    rows: list[list[Cell]] = [
        [Text(e.alias, style="bold"), e.repo_id, *_catalog_values(e)] for e in entries
    ]
    labels = [c.header for c in CATALOG_COLUMNS[2:]]
    records = []
    for e in entries:
        heading = Text(e.alias, style="bold") + Text("  ") + Text(e.repo_id)
        pairs = zip(labels, _catalog_values(e), strict=True)
        records.append(Record(heading, tuple((k, v) for k, v in pairs if v)))
    print_report(console, CATALOG_COLUMNS, rows, records, title=CATALOG_TITLE)


def catalog_json(entries: Sequence[CatalogEntry]) -> list[dict[str, Any]]:
    """The catalog as JSON rows."""
    return [
        {
            "alias": e.alias,
            "repo_id": e.repo_id,
            "kind": e.kind,
            "params": e.params,
            "bits": e.bits,
            "size_bytes": e.size_bytes,
            "context_window": e.context_window,
            "memory_bytes": e.memory_bytes,
            "note": e.note,
        }
        for e in entries
    ]


def info_json(model: LocalModel, *, test_model: bool = False) -> dict[str, Any]:
    """Everything known about a local model, as one JSON document."""
    features = template_features(read_chat_template(model.path))
    sampling = model.facts.sampling_defaults
    return model.as_json() | {
        "test_model": test_model,
        "problems": model.facts.problems(),
        "template_features": features.names(),
        "sampling_defaults": sampling.stated(),  # {} when the model recommends none
        "sampling_ignored": list(sampling.ignored),
        "files": sorted(p.name for p in model.path.iterdir()),
        "memory": memory_fit(model.facts.weights_bytes).describe(),
    }


def _words(items: list[str]) -> str:
    return ", ".join(items) or "none"


def _architecture(model_type: str | None, supported: bool) -> str:
    if model_type is None:
        return "unknown (config.json names none)"
    return f"{model_type} ({'mlx-lm supports it' if supported else 'not in this mlx-lm'})"


def _sampling(stated: dict[str, float | int], ignored: list[str]) -> str:
    """The model's recommended sampling in words, and what of it was left out."""
    text = describe_sampling(stated) or "none recommended (generation_config.json states none)"
    return f"{text}; ignored: {'; '.join(ignored)}" if ignored else text


def _images(vision: bool) -> str:
    if not vision:
        return "no (a text-only model: images sent to it get a 400)"
    # The engine loads through mlx-lm, which drops the tower (issue 34 brings mlx-vlm).
    return "yes, a vision model; served text-only in this release (images get a 400)"


def _shard_note(shard: str | None) -> str:
    return f" (shard {shard}: the files of these pipeline ranks only)" if shard else ""


def info_fields(data: dict[str, Any]) -> list[tuple[str, str]]:
    """`info_json`'s document as labelled values in words, in reading order."""
    refs = _words(data["refs"])
    return [
        ("alias", data["alias"] or "none"),
        ("repo", data["repo_id"] or "none (a local directory)"),
        ("source", data["source"]),
        ("path", data["path"]),
        ("revision", f"{data['revision']} ({refs})" if data["revision"] else "none"),
        ("size on disk", format_bytes(int(data["size_on_disk"]))),
        ("complete", yes_no(data["complete"]) + _shard_note(data.get("shard"))),
        ("architecture", _architecture(data["model_type"], data["architecture_supported"])),
        ("bits", str(data["quant_bits"] or "none")),
        ("dtype", data["dtype"] or "unknown"),
        ("params", params(data["param_count"])),
        ("context", _tokens(data["context_window"])),
        ("tool format", data["tool_format"] or "none found"),
        ("thinking", yes_no(data["thinking"])),
        ("images", _images(data["vision"])),
        ("template", _words(data["template_features"])),
        ("sampling", _sampling(data["sampling_defaults"], data["sampling_ignored"])),
        ("memory", data["memory"]),
        ("problems", "; ".join(data["problems"]) or "none"),
        ("last used", ago(data["last_used"])),
        ("files", _words(data["files"])),
    ]


def print_info(console: Console, heading: Text, fields: list[tuple[str, str]]) -> None:
    """`mlx models info`: one aligned `label value` line per field, values wrapped whole."""
    print_lines(console, record_blocks([Record(heading, tuple(fields))], console.width, pack=False))


def recommendation_json(
    memory: int | None,
    kind: str | None,
    compute: Compute | None = None,
    *,
    small: bool = False,
    beside: str | None = None,
) -> dict[str, Any]:
    """`mlx models recommend --json`: the pick, its figures, whether it fits, and why it is
    this one (this machine's compute unless told, whatever --memory says of its memory).

    `small`: the small model for Claude Code's haiku tier that fits beside the main model
    (`beside`, a catalog alias; None: the model recommended here), both counted together."""
    compute = compute or this_machine()
    found = recommendation(memory, kind=kind, compute=compute)
    extra: dict[str, Any] = {}
    if small:
        main = catalog_entry(beside) if beside else (found.entry if found else None)
        if beside and main is None:
            raise ConfigError(f"{beside} is not in the catalog (see: mlx models catalog)")
        found = small_recommendation(main, memory, compute=compute) if main else None
        if main is not None and main.size_bytes <= SMALL_MODEL_MAX_BYTES:
            raise ConfigError(
                f"{main.alias} is a small model already: it serves Claude Code's haiku tier "
                "itself (no second model needed)"
            )
        if found is None or main is None:
            what = main.alias if main else "any model"
            raise ConfigError(f"no catalog model fits beside {what} in this machine's memory")
        extra = {"beside": main.alias}
    if found is None:
        raise ConfigError("no catalog model fits this machine's memory")
    windows = found.entry.windows_here(memory)
    return (
        catalog_json([found.entry])[0]
        | extra
        | {
            "fits": found.fit.fits,
            "memory": found.fit.describe(),
            # The longest session this machine holds, by KV bits (16: unquantized, --kv-bits).
            "context_here": {str(bits): n for bits, n in windows.items()},
            "context_here_text": describe_windows(windows, found.entry.context_window),
            "compute": found.compute.describe() if found.compute else None,
            "speed_rule": found.speed_rule(),
            "pull_command": f"mlx models pull {found.entry.alias}",
        }
    )
