"""onceflow: an exactly-once streaming stack in Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.embedded import EmbeddedBroker

__all__ = ["EmbeddedBroker", "__version__"]

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so that `import onceflow.log` does not start the whole broker stack.
    if name == "EmbeddedBroker":
        from onceflow.embedded import EmbeddedBroker

        return EmbeddedBroker
    raise AttributeError(f"module 'onceflow' has no attribute {name!r}")
