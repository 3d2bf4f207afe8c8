"""Lazy re-exports for the stage packages' ``__init__`` (PEP 562).

A stage's ``__init__`` names its public API without importing it: ``import tern.kernels.policy``
must not load every numba kernel, and ``tern --help`` stays fast. The first access of a
name imports the submodule that defines it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public names live in submodules:
    ``exports`` maps each name to the submodule (relative to the package) defining it."""

    def __getattr__(name: str) -> Any:
        sub = exports.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
