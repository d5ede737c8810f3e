"""How sizes read, everywhere `mlx` shows one: binary units (KiB, MiB, GiB), one formatter.

Memory is counted in powers of 1024 (a 16 GiB Mac, `--memory` and `--cache-memory 8G`), and
a download that is compared with it must read the same way: so a model's files, a pull's
progress, a server's resident memory and the dashboard's cache all go through `format_bytes`.
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float) -> str:
    """`1536` -> `1.5 KiB`, `0` -> `0 B`: one decimal from KiB on, binary units."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """A transfer rate in the same units, e.g. `12.5 MiB/s`."""
    return f"{format_bytes(bytes_per_s)}/s"
