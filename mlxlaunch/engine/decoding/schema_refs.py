"""Tool schemas as the call grammars read them: local `$ref`s inlined, and what a schema allows.

`inline_refs` makes each piece of a tool's schema stand alone; the small readers below answer
what the grammars ask of a (resolved) schema: its parameters, whether it allows only strings,
which types a parser finds in it.

Tool-call grammars cut a tool's schema into pieces: one `%json` rule per parameter, or the
arguments wrapped inside a `{"name": …, "arguments": …}` envelope, or a non-JSON notation
built property by property. llguidance resolves `$ref` against the root of each `%json` it
compiles (measured with llguidance 1.9: `#/$defs/x` inside a wrapped schema fails with
"Pointer '/$defs/x' does not exist"), so the references have to go before the schema is cut.

`inline_refs` replaces every local reference (`#`, `#/$defs/…`, `#/definitions/…`, any JSON
pointer into the document) with its target. A reference met again inside its own expansion is
recursive: it is expanded `repeats` times along one path, and below that the schema allows any
JSON value, so a recursive structure is checked to that depth and free beneath it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from mlxlaunch.engine.types import InvalidRequest

# Keywords whose value is data, not a schema: never looked into for references.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names to schemas (a property may be called "$ref").
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})
# Where definitions live; dropped from the result once their uses are inlined.
_DEFINITIONS = frozenset({"$defs", "definitions"})
# Siblings of a `$ref` that do not constrain anything.
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment"})

# A schema that inlines to more nodes than this is refused rather than compiled.
MAX_NODES = 50_000


def inline_refs(schema: dict[str, Any], *, repeats: int = 2) -> dict[str, Any]:
    """`schema` with every local `$ref` replaced by what it points to.

    Args:
        schema: a JSON schema (its root is the document references point into).
        repeats: how many times a recursive reference is expanded along one path before
            that part allows any JSON value.

    Raises:
        InvalidRequest: a reference that is not local or points nowhere, or a schema that
            grows past `MAX_NODES` when inlined.
    """
    if not _has_ref(schema):
        return schema
    inliner = _Inliner(schema, repeats)
    resolved = inliner.schema(schema, ())
    return resolved if isinstance(resolved, dict) else {}


def _has_ref(node: Any) -> bool:
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return False


class _Inliner:
    def __init__(self, root: dict[str, Any], repeats: int) -> None:
        self._root = root
        self._repeats = repeats
        self._nodes = 0

    def schema(self, node: Any, path: tuple[str, ...]) -> Any:
        """One (sub)schema, resolved; `path` holds the references being expanded above it."""
        self._count()
        if isinstance(node, list):
            return [self.schema(v, path) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" or key in _DEFINITIONS:
                continue
            if key in _DATA_KEYWORDS:
                out[key] = value
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.schema(sub, path) for name, sub in value.items()}
            else:
                out[key] = self.schema(value, path)
        ref = node.get("$ref")
        if ref is None:
            return out
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise InvalidRequest(
                f"cannot resolve $ref {ref!r}: only local references are supported"
            )
        if path.count(ref) >= self._repeats:
            target: Any = {}  # recursion cut off: any JSON value from here down
        else:
            target = self.schema(_pointer(self._root, ref), (*path, ref))
        return _merge(target, out)

    def _count(self) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise InvalidRequest("a tool schema is too large once its $refs are inlined")


def _pointer(root: dict[str, Any], ref: str) -> Any:
    """The value a local reference ("#", "#/a/b") points to in `root`."""
    fragment = unquote(ref[1:])
    node: Any = root
    if not fragment:
        return node
    if not fragment.startswith("/"):
        raise InvalidRequest(f"cannot resolve $ref {ref!r}: anchors are not supported")
    for part in fragment[1:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and _index(key) < len(node):
            node = node[int(key)]
        else:
            raise InvalidRequest(f"cannot resolve $ref {ref!r}: it points nowhere")
    return node


def _merge(target: Any, siblings: dict[str, Any]) -> Any:
    """A reference's target with the keywords written next to the reference (2020-12 allows
    both): as one schema when they do not overlap, as `allOf` when they do."""
    constraining = {k: v for k, v in siblings.items() if k not in _ANNOTATIONS}
    if not constraining:
        return target
    if not isinstance(target, dict):
        return {"allOf": [target, constraining]}
    if constraining.keys() & target.keys():
        return {"allOf": [target, constraining]}
    return {**target, **constraining}


# --- what a schema allows ---------------------------------------------------------------------


def parameters(schema: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """An object schema's properties (each a schema dict) and the required names among them."""
    declared = schema.get("properties")
    props = {k: as_schema(v) for k, v in declared.items()} if isinstance(declared, dict) else {}
    listed = schema.get("required")
    names = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
    required = [p for p in dict.fromkeys(names) if p in props]
    return props, required


def as_schema(value: Any) -> dict[str, Any]:
    """`value` when it is a schema object; `{}` (anything) for booleans and junk."""
    return value if isinstance(value, dict) else {}


def required_first(props: dict[str, Any], required: list[str]) -> list[str]:
    """Property names, required ones first, then the others, each in schema order."""
    return required + [p for p in props if p not in required]


def allows_undeclared(schema: dict[str, Any]) -> bool:
    """Whether an object schema allows properties it does not declare."""
    return schema.get("additionalProperties", True) is not False


def string_only(schema: dict[str, Any]) -> bool:
    """Whether every value `schema` allows is a string."""
    declared = schema.get("type")
    if declared is not None:
        return declared == "string" or declared == ["string"]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return all(isinstance(b, dict) and string_only(b) for b in branches)
    literals = [schema["const"]] if "const" in schema else schema.get("enum")
    return (
        isinstance(literals, list) and bool(literals) and all(isinstance(v, str) for v in literals)
    )


def never_string(schema: dict[str, Any]) -> bool:
    """Whether `schema` visibly allows no strings (a non-string type, or a container)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return declared != "string"
    if isinstance(declared, list):
        return bool(declared) and "string" not in declared
    return "properties" in schema or "items" in schema


def declared_types(schema: Any) -> set[str]:
    """The type names a schema mentions (type, enum values, anyOf/oneOf/allOf branches), as
    mlx-lm's minimax parser collects them: {"string"} when there are none."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    for t in declared if isinstance(declared, list) else [declared]:
        if isinstance(t, str):
            types.add(t.lower())
    for value in schema.get("enum") or []:
        types.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or []:
            types |= declared_types(branch)
    return types or {"string"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for kind, name in ((int, "integer"), (float, "number"), (str, "string"), (list, "array")):
        if isinstance(value, kind):
            return name
    return "object"


def merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `allOf` parts merged in shallowly (properties and required united;
    otherwise the first word on a keyword wins) — an approximation, for notations that
    cannot intersect."""
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema.get("allOf") or []:
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, dict):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _index(key: str) -> int:
    """A JSON-pointer step as an array index, or a number past any array when it is none:
    ASCII digits only (`isdigit` takes "²", which int() refuses), and few enough for int()."""
    if key.isascii() and key.isdigit() and len(key) <= 18:
        return int(key)
    return 1 << 63
