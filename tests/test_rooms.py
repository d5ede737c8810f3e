"""The rooms of DESIGN.md depend on each other one way only; this test keeps the picture true."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mlxlaunch"

# room -> rooms it may import; top-level modules (errors.py, config.py, …) are open to all.
ALLOWED: dict[str, set[str] | None] = {
    "protocol": set(),
    "store": set(),
    "engine": {"store"},
    "server": {"protocol", "engine"},
    "launch": {"server", "engine", "store", "protocol", "testing"},
    "dash": {"protocol"},
    "testing": {"engine", "store"},
    "bench": {"server", "engine", "store", "protocol", "testing", "launch"},
    "cli": None,  # the top of the picture may import anything
}

# Libraries a room must not touch at all (DESIGN.md, "must not").
FORBIDDEN_LIBS = {
    "protocol": {"mlx", "mlx_lm", "starlette", "uvicorn"},
    "server": {"mlx", "mlx_lm"},
    "store": {"mlx", "mlx_lm"},
    "dash": {"mlx", "mlx_lm"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    here = list(path.relative_to(PKG.parent).with_suffix("").parts)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
                found.append((node.lineno, mod))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def test_rooms_depend_one_way() -> None:
    rooms = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert set(ALLOWED) >= rooms, f"rooms not in the picture: {rooms - set(ALLOWED)}"
    problems = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).parts
        if len(rel) < 2:
            continue
        room = rel[0]
        allowed = ALLOWED.get(room)
        for line, name in _imports(f):
            parts = name.split(".")
            if parts[0] == "mlxlaunch" and len(parts) > 1 and parts[1] in rooms:
                target = parts[1]
                if allowed is not None and target != room and target not in allowed:
                    problems.append(f"{f.relative_to(PKG)}:{line} {room}/ imports {target}/")
            if parts[0] in FORBIDDEN_LIBS.get(room, set()):
                problems.append(f"{f.relative_to(PKG)}:{line} {room}/ imports {parts[0]}")
    assert not problems, "\n".join(problems)


def test_modules_stay_small() -> None:
    big = [
        f"{f.relative_to(PKG)}: {n} lines"
        for f in PKG.rglob("*.py")
        if (n := f.read_text().count("\n")) > 800
    ]
    assert not big, big
