"""Text snapshots of what the CLI prints, kept under tests/cli_snapshots/, plus the structural
checks that hold whatever a snapshot says (so a careless regeneration still fails).

Regenerate after an intended change with `MLXLAUNCH_UPDATE_SNAPSHOTS=1 pytest tests/...`, then
read the diff of the .txt files before committing it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rich.cells import cell_len

# Not under __snapshots__/: syrupy (the dashboard's SVG snapshots) owns that folder and fails a
# run that leaves files there it did not use.
SNAPSHOTS = Path(__file__).resolve().parent / "cli_snapshots"
UPDATE_ENV = "MLXLAUNCH_UPDATE_SNAPSHOTS"


def assert_snapshot(group: str, name: str, text: str) -> None:
    """`text` equals the stored snapshot `group/name.txt` (written instead, when updating)."""
    path = SNAPSHOTS / group / f"{name}.txt"
    # Rich pads a title to the table's width: trailing spaces say nothing, and editors strip them.
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"no snapshot {path}: run with {UPDATE_ENV}=1 to write it"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (
        f"{path.name} changed; if intended, regenerate with {UPDATE_ENV}=1 and review the diff"
    )


def assert_fits(text: str, width: int) -> None:
    """No line is wider than `width`, and nothing was cut short with an ellipsis."""
    too_wide = [line for line in text.splitlines() if cell_len(line) > width]
    assert not too_wide, f"lines wider than {width}:\n" + "\n".join(too_wide)
    assert "…" not in text, "something was cut short:\n" + text
    # A rich column squeezed to nothing leaves its borders touching: ┃┃ or ││.
    for squeezed in ("┃┃", "││", "┳┳", "┬┬"):
        assert squeezed not in text, f"a column collapsed to nothing ({squeezed}):\n{text}"


def assert_whole(text: str, values: Iterable[str]) -> None:
    """Each of `values` appears unbroken on one line of `text`."""
    lines = text.splitlines()
    missing = [v for v in values if v and not any(v in line for line in lines)]
    assert not missing, f"not shown whole on one line: {missing}\n{text}"
