"""Offline test models and test doubles at the model boundary (see DESIGN.md, Testing).

Nothing here is needed at run time except ``ensure_test_model("demo")`` for ``--model demo``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Names resolve lazily (PEP 562): the CLI asks "is this a test model name?" on every start, and
# must not pay for importing mlx to find out.
_EXPORTS = {
    "CONTEXT_WINDOW": "builder",
    "MODEL_SIZES": "builder",
    "ModelShape": "builder",
    "build_model": "builder",
    "DEMO_NOTICE": "cache",
    "TEST_MODELS": "cache",
    "cached_models_dir": "cache",
    "ensure_test_model": "cache",
    "is_test_model_name": "cache",
    "notice_for_test_model": "cache",
    "FailingModel": "failing",
    "ForwardFailures": "failing",
    "fail_forward": "failing",
    "ForcedTokens": "scripted",
    "ScriptedOutput": "scripted",
    "TEMPLATE_FAMILIES": "templates",
    "TemplateFamily": "templates",
    "template_family": "templates",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return __all__
