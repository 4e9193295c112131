"""The payments and bookings pipeline on Spark (issue 4).

A payment captured for a flight seat must confirm the order and take the seat together, and count
once in the account's balance, whatever crashes:

    payments ──onceflow source (read_committed)──┬─ bookings: order-status + seat-reservations
                                                 │  (or payments-rejected), one transaction per task
                                                 └─ balances: per-account sums + progress, one DB
                                                    transaction per micro-batch

`onceflow pipeline generate` writes seeded input, `onceflow pipeline run` runs the queries (see
`job`). For a demo or a test: `generate`, then `PipelineProcess(...).start()`, `.kill()`, `.start()`
again, and compare `read_balances` and `read_outputs` with the workload's `expected_*` methods.
Nothing here imports pyspark except `job`, which runs in the pipeline process.
"""

from onceflow.pipeline.events import Workload, generate, make_workload
from onceflow.pipeline.process import Outputs, PipelineProcess, read_balances, read_outputs, read_progress
from onceflow.pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, PipelineSettings

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "Outputs",
    "PipelineProcess",
    "PipelineSettings",
    "Workload",
    "generate",
    "make_workload",
    "read_balances",
    "read_outputs",
    "read_progress",
]
