"""Optional dependencies: `pip install onceflow` is the broker, the operators' tools and the lab;
Spark, PostgreSQL and the demo come with extras (see pyproject.toml)."""

from __future__ import annotations

import importlib.util


class MissingExtraError(ImportError):
    """A part of onceflow was used without the extra that installs its dependencies."""

    def __init__(self, feature: str, needs: str, extra: str) -> None:
        super().__init__(f"{feature} needs {needs}: pip install 'onceflow[{extra}]'")
        self.extra = extra


def require(feature: str, needs: str, extra: str, modules: tuple[str, ...]) -> None:
    """Fail early, before starting work that would need `modules` later (in a subprocess, say)."""
    if any(importlib.util.find_spec(module) is None for module in modules):
        raise MissingExtraError(feature, needs, extra)
