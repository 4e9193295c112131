"""What `onceflow pipeline run` runs with; free of pyspark, so the command line starts fast."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
# The balances query's id in the store in exactly-once runs (at-least-once runs take a new one each).
BALANCES_QUERY_ID = "payments-balances"


@dataclass(frozen=True)
class PipelineSettings:
    bootstrap: str
    # A directory or a URL Spark can keep checkpoints at (hdfs://, s3a://, ...).
    checkpoint: str | Path
    db: str
    master: str = "local[2]"
    guarantee: str = EXACTLY_ONCE
    trigger_ms: int | None = None
    max_offsets: int | None = None
    until_idle_s: float | None = None

    def checkpoint_of(self, query: str) -> str:
        """The checkpoint location of one of the pipeline's queries, under `checkpoint`."""
        return f"{str(self.checkpoint).rstrip('/')}/{query}"
