"""A model's recommended sampling settings, read from its `generation_config.json`.

Most instruct models publish the settings they were tuned for there (Qwen3: temperature 0.6,
top_p 0.95, top_k 20); the engine uses them for every field a client leaves unset.

What is read, and what is not:
- `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty` — each on its own: a value
  that is not a number (a string, a bool, null), not finite, or out of its range below is
  dropped with a note, and the others still count. A file that is absent states nothing; one
  that cannot be read or is not a JSON object states nothing and gets a note.
- `do_sample` is not read. It is the switch of transformers' `generate()`, whose own default is
  False (greedy) — and configs written with it false still carry the author's recommended
  values, which is what a user running the model expects (vLLM reads these files the same
  way). Greedy decoding also sends reasoning models into loops, which their model cards warn
  about; a client that wants greedy asks for temperature 0.
- transformers' implicit defaults (top_k 50 when the file names none) are not applied: only
  what the file states counts.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENERATION_CONFIG = "generation_config.json"

log = logging.getLogger(__name__)

# Ranges a stated value must fall in; outside them a value is a mistake (or hostile), and
# honouring it would turn the output into noise or make mlx-lm's samplers raise mid-batch.
MAX_TEMPERATURE = 2.0
MAX_TOP_K = 1_000  # far below any real vocabulary (mlx-lm refuses top_k >= vocabulary size)
MIN_REPETITION_PENALTY = 0.5
MAX_REPETITION_PENALTY = 2.0


@dataclass(frozen=True)
class SamplingDefaults:
    """The sampling settings a model's generation_config.json states; None: not stated.

    `ignored` says, in words, what was in the file but not taken (never compared: two readings
    with the same values are the same defaults).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignored: tuple[str, ...] = field(default=(), compare=False)

    def stated(self) -> dict[str, float | int]:
        """The stated settings by their generation_config.json name, in a fixed order."""
        values = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }
        return {name: value for name, value in values.items() if value is not None}

    def describe(self) -> str:
        """The stated settings in one line, e.g. `temperature 0.6, top_p 0.95, top_k 20`."""
        return describe_sampling(self.stated())


def describe_sampling(stated: Mapping[str, float | int]) -> str:
    """Settings by name in one line (what `SamplingDefaults.stated` gives, or its JSON)."""
    return ", ".join(f"{name} {value:g}" for name, value in stated.items())


NO_DEFAULTS = SamplingDefaults()


# name -> (lowest, highest, whether the lowest itself is excluded)
RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, MAX_TEMPERATURE, False),  # 0: greedy
    "top_p": (0.0, 1.0, True),  # 1: off
    "top_k": (0.0, MAX_TOP_K, False),  # 0: off
    "min_p": (0.0, 1.0, False),  # 0: off
    "repetition_penalty": (MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY, False),  # 1: off
}


def _checked(data: dict[str, Any], name: str) -> float | str | None:
    """The value stated as `name` when it is a usable number; None when not stated; else a
    note (str) saying why it is ignored."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} {value!r:.40} (not a number)"
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return f"{name} (too large)"
    if not math.isfinite(number):
        return f"{name} {number} (not finite)"
    low, high, open_low = RANGES[name]
    if number < low or number > high or (open_low and number == low):
        return f"{name} {number:g} (outside {'(' if open_low else '['}{low:g}, {high:g}])"
    if name == "top_k" and not number.is_integer():
        return f"{name} {number:g} (not a whole number)"
    return number


def parse_sampling_defaults(data: object) -> SamplingDefaults:
    """The sampling defaults stated by a parsed generation_config.json document."""
    if not isinstance(data, dict):
        return SamplingDefaults(ignored=("the whole file (not a JSON object)",))
    checked = {name: _checked(data, name) for name in RANGES}
    kept = {name: v for name, v in checked.items() if isinstance(v, float)}
    top_k = kept.get("top_k")
    return SamplingDefaults(
        temperature=kept.get("temperature"),
        top_p=kept.get("top_p"),
        top_k=None if top_k is None else int(top_k),
        min_p=kept.get("min_p"),
        repetition_penalty=kept.get("repetition_penalty"),
        ignored=tuple(v for v in checked.values() if isinstance(v, str)),
    )


def read_sampling_defaults(path: Path, *, report: bool = False) -> SamplingDefaults:
    """The sampling defaults in `path`/generation_config.json; never raises.

    Args:
        path: the model directory.
        report: log the defaults found (info) and each thing ignored (a warning), as the
            engine's loader does; listings, which show both themselves, do not.
    """
    file = path / GENERATION_CONFIG
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return NO_DEFAULTS
    except (OSError, UnicodeDecodeError) as exc:
        defaults = SamplingDefaults(ignored=(f"the whole file (unreadable: {exc})",))
    else:
        try:
            defaults = parse_sampling_defaults(json.loads(text))
        except (ValueError, RecursionError):  # not JSON; an integer too long; nested too deep
            defaults = SamplingDefaults(ignored=("the whole file (not valid JSON)",))
    if report:
        for note in defaults.ignored:
            log.warning("%s: ignored %s", file, note)
        if defaults.stated():
            log.info("sampling defaults from %s: %s", file, defaults.describe())
    return defaults
