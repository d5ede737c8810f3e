"""The rooms of DESIGN.md depend on each other one way only; this test keeps the picture true.

`engine/` is drawn in more detail: a face (what other rooms import) over sub-rooms with their
own one-way rules, and mlx-lm's private names read in one sub-room only.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mlxlaunch"
ENGINE = PKG / "engine"

# room -> rooms it may import; top-level modules (errors.py, config.py, …) are open to all.
ALLOWED: dict[str, set[str] | None] = {
    "protocol": set(),
    "store": set(),
    "engine": {"store"},
    "server": {"protocol", "engine"},
    "launch": {"server", "engine", "store", "protocol", "testing", "cluster"},
    "cluster": {"store", "testing"},  # hosts, probes and checks across machines
    "dash": {"protocol"},
    "testing": {"engine", "store"},
    "bench": {"server", "engine", "store", "protocol", "testing", "launch", "cluster"},
    "cli": None,  # the top of the picture may import anything
}

# Libraries a room must not touch at all (DESIGN.md, "must not").
FORBIDDEN_LIBS = {
    "protocol": {"mlx", "mlx_lm", "starlette", "uvicorn"},
    "server": {"mlx", "mlx_lm"},
    "store": {"mlx", "mlx_lm"},
    "dash": {"mlx", "mlx_lm"},
}

# The engine's face: the only engine modules other rooms import. `engine.py` wires the
# sub-rooms together; the others are the vocabulary every sub-room shares, and import none.
# `models.py` serves several engines behind the same face, so it wires too.
ENGINE_FACE = {"engine", "models", "types", "config", "settings", "stats", "tool_ids"}
ENGINE_WIRING = {"engine", "models"}
ENGINE_VOCABULARY = ENGINE_FACE - ENGINE_WIRING

# engine sub-room -> sub-rooms it may import (each may import the vocabulary; none imports
# engine.py). Only scheduling/ and the face wire sub-rooms together; runtime/ sits at the bottom.
ENGINE_ALLOWED: dict[str, set[str]] = {
    "runtime": set(),  # loader, warm-up, memory, MLX thread, CPU attention, mlx-lm internals
    "output": set(),  # streaming parser, markers, tool-call parsing
    "prompt": {"runtime"},  # rendering, incremental tokenization, system turns
    "decoding": {"runtime"},  # decoding plan, grammars, thinking budget
    "cache": {"runtime"},  # prefix cache, block trie, snapshots, disk tier, misses
    "scheduling": {"runtime", "cache", "prompt", "decoding", "output"},  # worker loop, jobs
}

# The one engine sub-room that may read mlx-lm's private attributes (behind functions).
PRIVATE_NAMES_ROOM = "runtime"
MAX_MODULE_LINES = 700


@functools.cache  # several tests read every product module's imports: parse each once
def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import; `from a import b` gives `a.b` (b may be a module).
    Shared between callers: read it, do not change it."""
    return imported_names(path.read_text(), path.relative_to(PKG.parent).with_suffix("").parts)


def imported_names(source: str, here_parts: Iterable[str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every import statement in `source`, wherever it stands (under
    `TYPE_CHECKING`, inside a function), for the module whose path parts (without `.py`,
    `__init__` included for a package) are `here_parts`."""
    tree = ast.parse(source)
    here = list(here_parts)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                mod = node.module
            else:
                continue
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return found


def _product_modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_rooms_depend_one_way() -> None:
    rooms = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert set(ALLOWED) >= rooms, f"rooms not in the picture: {rooms - set(ALLOWED)}"
    problems = []
    for f in _product_modules():
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


# --- engine/: a face over sub-rooms -----------------------------------------------------


def _engine_unit(dotted: str) -> str | None:
    """The engine part a dotted name belongs to: a sub-room, `face:<module>`, or None when it
    is not in the engine (or is the bare package)."""
    parts = dotted.split(".")
    if parts[:2] != ["mlxlaunch", "engine"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ENGINE_ALLOWED else f"face:{parts[2]}"


def _unit_of_file(path: Path) -> str | None:
    return _engine_unit(".".join(path.relative_to(PKG.parent).with_suffix("").parts))


def engine_import_graph() -> dict[str, set[str]]:
    """Sub-room -> the other sub-rooms its modules import (TYPE_CHECKING imports included)."""
    graph: dict[str, set[str]] = {room: set() for room in ENGINE_ALLOWED}
    for f in sorted(ENGINE.rglob("*.py")):
        unit = _unit_of_file(f)
        if unit in ENGINE_ALLOWED:
            for _, name in _imports(f):
                target = _engine_unit(name)
                if target in ENGINE_ALLOWED and target != unit:
                    graph[unit].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle is not None:
            return cycle
    return None


def test_every_engine_module_is_in_the_picture() -> None:
    faces = {f"face:{name}" for name in ENGINE_FACE} | {"face:__init__"}
    stray = [
        str(f.relative_to(PKG))
        for f in sorted(ENGINE.rglob("*.py"))
        if (unit := _unit_of_file(f)) not in ENGINE_ALLOWED and unit not in faces
    ]
    assert not stray, f"engine modules outside the face and the sub-rooms: {stray}"
    rooms = {p.name for p in ENGINE.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ENGINE_ALLOWED), (
        f"sub-rooms not in ENGINE_ALLOWED: {rooms ^ set(ENGINE_ALLOWED)}"
    )


def _engine_import_problem(unit: str | None, target: str) -> str | None:
    """What is wrong with engine part `unit` importing engine part `target`, if anything."""
    if target.startswith("face:"):
        name = target.removeprefix("face:")
        if name not in ENGINE_FACE:
            return f"imports engine.{name}, which is neither the face nor a sub-room"
        if name in ENGINE_WIRING and unit not in {f"face:{w}" for w in ENGINE_WIRING}:
            return f"imports the face's wiring ({name}.py)"
        return None
    if unit in ENGINE_ALLOWED:
        return None if target in ENGINE_ALLOWED[unit] else f"engine/{unit} imports engine/{target}"
    if unit is not None and unit.removeprefix("face:") in ENGINE_VOCABULARY:
        return f"the face's {unit.removeprefix('face:')}.py imports engine/{target}"
    return None  # engine.py and models.py wire any sub-room


def test_engine_sub_rooms_depend_one_way() -> None:
    problems = [
        f"{f.relative_to(PKG)}:{line} {problem}"
        for f in sorted(ENGINE.rglob("*.py"))
        for line, name in _imports(f)
        if (target := _engine_unit(name)) is not None
        and target != (unit := _unit_of_file(f))
        and (problem := _engine_import_problem(unit, target)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_engine_sub_rooms_import_no_circles() -> None:
    assert find_cycle({room: set(allowed) for room, allowed in ENGINE_ALLOWED.items()}) is None
    cycle = find_cycle(engine_import_graph())
    assert cycle is None, "engine sub-rooms import in a circle: " + " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# --- modules: no import circles, hidden ones included ----------------------------------


def _module_name(path: str) -> tuple[str, list[str]]:
    """The dotted module name of a file path ("mlxlaunch/store/__init__.py": mlxlaunch.store),
    and its path parts as imported_names wants them."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts), parts


def _named_imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Modules imported by name at run time rather than by a statement: the `mlxlaunch.cli.<m>`
    of each `LazyCommand` (cli/lazy_group.py), and each submodule that a package importing on
    first use (PEP 562 `__getattr__` with importlib) names in a string."""
    lazy_package = is_package and any(
        isinstance(node, ast.Attribute) and node.attr == "import_module" for node in ast.walk(tree)
    )
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LazyCommand":
            keywords = [k.value for k in node.keywords if k.arg == "module"]
            for arg in [*node.args[1:2], *keywords]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(f"mlxlaunch.cli.{arg.value}")
        elif (
            lazy_package
            and isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and f"{module}.{node.value}" in modules
        ):
            found.add(f"{module}.{node.value}")
    return found


def module_import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules among `sources` (file path -> text) it imports. Every import
    counts, under `TYPE_CHECKING` or inside a function too: each is a dependency that a reader
    (or mypy, or the first call) follows, and hiding one does not cut the circle."""
    names = {path: _module_name(path) for path in sources}
    modules = {module for module, _ in names.values()}
    graph: dict[str, set[str]] = {}
    for path, source in sources.items():
        module, parts = names[path]
        targets = set()
        for _, name in imported_names(source, parts):
            # `from a import b`: b is a module of its own, or a name defined in a
            target = name if name in modules else name.rpartition(".")[0]
            if target in modules:
                targets.add(target)
        tree = ast.parse(source)
        targets |= _named_imports(tree, module, parts[-1] == "__init__", modules)
        graph[module] = targets - {module}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Nodes reached from `start` along one edge or more."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return seen


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Each set of nodes that reach one another (a strongly connected part of two or more)."""
    reach = {node: _reachable(graph, node) for node in graph}
    circles = {
        frozenset({node} | {other for other in reach[node] if node in reach[other]})
        for node in graph
        if node in reach[node]
    }
    return sorted(circles, key=sorted)


def _a_path_round(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    path = find_cycle({node: graph[node] & circle for node in circle}) or sorted(circle)
    return " -> ".join(path)


def test_modules_import_no_circles() -> None:
    sources = {f.relative_to(PKG.parent).as_posix(): f.read_text() for f in _product_modules()}
    graph = module_import_graph(sources)
    circles = import_circles(graph)
    found = [_a_path_round(graph, c) for c in circles]
    assert not found, "modules import in a circle:\n" + "\n".join(found)


def test_the_circle_rule_counts_hidden_and_named_imports() -> None:
    sources = {
        "mlxlaunch/__init__.py": "",
        # behind TYPE_CHECKING one way, inside a function the other
        "mlxlaunch/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from mlxlaunch.b import B\n",
        "mlxlaunch/b.py": "def f():\n    from . import a\n",
        # one way only: no circle; `thing` is a name in d, not a module
        "mlxlaunch/c.py": "from mlxlaunch.d import thing\n",
        "mlxlaunch/d.py": "import os\n",
        # a command table names its modules; the command imports the table
        "mlxlaunch/cli/__init__.py": "",
        "mlxlaunch/cli/main.py": 'COMMANDS = (LazyCommand("x", "x_cmd", "x", "Do x."),)\n',
        "mlxlaunch/cli/x_cmd.py": "from mlxlaunch.cli.main import COMMANDS\n",
        # a package that imports on first use, and a submodule that imports the package
        "mlxlaunch/pkg/__init__.py": "import importlib\n_HOMES = {'inner': ('name',)}\n"
        "def __getattr__(n):\n    return importlib.import_module(f'{__name__}.inner')\n",
        "mlxlaunch/pkg/inner.py": "import mlxlaunch.pkg\n",
    }
    graph = module_import_graph(sources)
    assert graph["mlxlaunch.c"] == {"mlxlaunch.d"}
    assert import_circles(graph) == [
        frozenset({"mlxlaunch.a", "mlxlaunch.b"}),
        frozenset({"mlxlaunch.cli.main", "mlxlaunch.cli.x_cmd"}),
        frozenset({"mlxlaunch.pkg", "mlxlaunch.pkg.inner"}),
    ]
    assert _a_path_round(graph, frozenset({"mlxlaunch.a", "mlxlaunch.b"})) == (
        "mlxlaunch.a -> mlxlaunch.b -> mlxlaunch.a"
    )


def test_other_rooms_import_only_the_engines_face() -> None:
    problems = []
    for f in _product_modules():
        if f.is_relative_to(ENGINE):
            continue
        for line, name in _imports(f):
            unit = _engine_unit(name)
            if unit is not None and unit.removeprefix("face:") not in ENGINE_FACE:
                problems.append(f"{f.relative_to(PKG)}:{line} imports {name} (not the face)")
    assert not problems, "\n".join(problems)


# --- mlx-lm's private names: engine/runtime only ----------------------------------------

_ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}
_LIBRARIES_WITH_PRIVATES = {"mlx_lm", "mlx", "transformers", "tokenizers"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.AST) -> set[str]:
    """Names a module defines itself: functions, classes, assigned names, and attributes it
    assigns on `self` or `cls` (an attribute assigned on any other object is not its own)."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
    return own


def _stdlib_modules(tree: ast.AST) -> set[str]:
    """Local names bound by `import <standard library module>` (os._exit is theirs to offer)."""
    return {
        (a.asname or a.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name.split(".")[0] in sys.stdlib_module_names
    }


def foreign_private_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private attribute `source` reads or writes on an object that is
    not its own: `x._name` and `getattr(x, "_name")`, but not `self._name`, names the module
    defines itself, or a standard library module's (`os._exit`)."""
    tree = ast.parse(source)
    own, stdlib = _own_names(tree), _stdlib_modules(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in stdlib):
                continue
            if node.attr not in own:
                found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_CALLS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def _uses_libraries_with_privates(path: Path) -> bool:
    return any(name.split(".")[0] in _LIBRARIES_WITH_PRIVATES for _, name in _imports(path))


def test_only_engine_runtime_reads_mlx_lm_private_names() -> None:
    # Every engine module outside runtime/ (an mlx-lm object may arrive typed Any), and every
    # other product module that imports mlx-lm or its libraries.
    runtime = ENGINE / PRIVATE_NAMES_ROOM
    problems = [
        f"{f.relative_to(PKG)}:{line} reads `{name}` of an object it does not own"
        f" (mlx-lm private names belong in engine/{PRIVATE_NAMES_ROOM}/mlx_lm_internals.py)"
        for f in _product_modules()
        if not f.is_relative_to(runtime)
        and (f.is_relative_to(ENGINE) or _uses_libraries_with_privates(f))
        for line, name in foreign_private_reads(f.read_text())
    ]
    assert not problems, "\n".join(problems)


def _names(found: Iterable[tuple[int, str]]) -> list[str]:
    return [name for _, name in found]


def test_the_private_name_rule_catches_real_cases_only() -> None:
    caught = """
import os
def merge(batch, wrapper, generator):
    batch._idx = 3
    hf = wrapper._tokenizer
    pending = getattr(getattr(generator, "_generation_batch", None), "_next_tokens", None)
    os._exit(0)
"""
    found = sorted(_names(foreign_private_reads(caught)))
    assert found == ["_generation_batch", "_idx", "_next_tokens", "_tokenizer"]
    allowed = """
_cache = {}
class Trie:
    def __init__(self):
        self._root = None
    def merge(self, other: "Trie"):
        return self._root or other._root or _helper(_cache)
def _helper(x):
    return getattr(x, "_root", None)
"""
    assert foreign_private_reads(allowed) == []


def test_modules_stay_small() -> None:
    big = [
        f"{f.relative_to(PKG)}: {n} lines"
        for f in _product_modules()
        if (n := f.read_text().count("\n")) > MAX_MODULE_LINES
    ]
    assert not big, big


# Over this many lines a module says why in its docstring, in a paragraph that starts with
# `SIZE_REASON` (one idea that cannot be cut without passing its state around, say).
EXPLAINED_MODULE_LINES = 600
SIZE_REASON = "Why over 600 lines:"


def unexplained_size(source: str, limit: int = EXPLAINED_MODULE_LINES) -> bool:
    """Whether a module's `source` is over `limit` lines without saying why in its docstring."""
    if source.count("\n") <= limit:
        return False
    docstring = ast.get_docstring(ast.parse(source)) or ""
    return not any(p.startswith(SIZE_REASON) for p in docstring.split("\n\n"))


def test_big_modules_say_why() -> None:
    unexplained = {
        f.relative_to(PKG).as_posix() for f in _product_modules() if unexplained_size(f.read_text())
    }
    assert not unexplained, sorted(unexplained)


def test_the_size_rule_wants_a_reason_only_over_the_limit() -> None:
    body = "x = 1\n" * 5
    assert not unexplained_size(f'"""Short."""\n{body}', limit=10)
    assert unexplained_size(f'"""Long."""\n{body * 3}', limit=10)
    explained = f'"""Long.\n\n{SIZE_REASON} one class, one state."""\n{body * 3}'
    assert not unexplained_size(explained, limit=10)


# --- testing/: needed at run time by `--model demo` only ----------------------------------

# The product modules that may import mlxlaunch.testing: the test-model names and builds, and
# the demo's scripted replies, all asked through launch/models.py. Scripted output for tests
# comes in through an explicit logits_hook (tests/scripted_mlx.py), never from the product.
# The cluster probe finds built test models where ensure_test_model puts them, without building.
MAY_IMPORT_TESTING = {"launch/models.py", "cluster/probe.py"}


def test_only_the_test_model_path_imports_testing() -> None:
    testing = PKG / "testing"
    problems = [
        f"{f.relative_to(PKG)}:{line} imports {name}"
        for f in _product_modules()
        if not f.is_relative_to(testing) and f.relative_to(PKG).as_posix() not in MAY_IMPORT_TESTING
        for line, name in _imports(f)
        if name == "mlxlaunch.testing" or name.startswith("mlxlaunch.testing.")
    ]
    assert not problems, "\n".join(problems)
    assert all((PKG / path).is_file() for path in MAY_IMPORT_TESTING)
