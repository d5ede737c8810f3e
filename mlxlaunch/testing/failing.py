"""A model whose forward pass fails on demand, to test how the engine survives it.

:func:`fail_forward` returns an engine ``model_wrapper``; a shared :class:`ForwardFailures`
switch decides which forward calls raise. Everything except the call itself (layers,
``make_cache``, ``args``, parameters) is the real model's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import mlx.nn as nn


class ForwardFailures:
    """Decides which forward passes raise; shared between a test and the engine thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._skip = 0
        self._remaining = 0
        self.calls = 0  # forward passes attempted, failed or not
        self.failures = 0  # forward passes that raised

    def fail_next(self, times: int = 1, *, after: int = 0) -> None:
        """Let ``after`` more forward passes succeed, then fail the following ``times``."""
        with self._lock:
            self._skip = after
            self._remaining = times

    def fail_always(self) -> None:
        """Fail every forward pass until :meth:`heal`."""
        self.fail_next(times=-1)

    def heal(self) -> None:
        """Stop failing."""
        with self._lock:
            self._skip = 0
            self._remaining = 0

    def check(self) -> None:
        """Count one forward pass; raise ``RuntimeError`` if it is one that must fail."""
        with self._lock:
            self.calls += 1
            if self._remaining == 0:
                return
            if self._skip > 0:
                self._skip -= 1
                return
            if self._remaining > 0:
                self._remaining -= 1
            self.failures += 1
            number = self.calls
        raise RuntimeError(f"injected forward failure (forward pass #{number})")


class FailingModel(nn.Module):
    """Wraps a real model; the forward pass consults ``failures`` before running."""

    def __init__(self, model: nn.Module, failures: ForwardFailures) -> None:
        super().__init__()
        self.wrapped = model
        self.failures = failures

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.failures.check()
        return self.wrapped(*args, **kwargs)

    def __getattr__(self, key: str) -> Any:
        # nn.Module keeps children in its dict; anything else comes from the real model.
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "wrapped" not in self:  # still inside __init__
                raise
            return getattr(self["wrapped"], key)


def fail_forward(failures: ForwardFailures) -> Callable[[nn.Module], nn.Module]:
    """An engine ``model_wrapper`` that makes the loaded model fail as ``failures`` says."""

    def wrap(model: nn.Module) -> nn.Module:
        return FailingModel(model, failures)

    return wrap
