"""kio entities that the admin client decodes differently from kio.

Kafka answers DescribeTransactions with transaction_start_time = -1 when no transaction is
open (Empty, Complete*, unknown ids), and kio's reader for that timestamp rejects negative
values. These subclasses declare it nullable, so kio's nullable reader turns -1 into None.
"""

# No `from __future__ import annotations` here: kio's readers need real annotation objects.

from dataclasses import dataclass, field

from kio.schema.describe_transactions.v0 import response as describe_transactions_v0
from kio.static.primitive import TZAware


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionState(describe_transactions_v0.TransactionState):
    transaction_start_time: TZAware | None = field(  # type: ignore[assignment]
        metadata={"kafka_type": "datetime_i64"}
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeTransactionsResponseV0(describe_transactions_v0.DescribeTransactionsResponse):
    transaction_states: tuple[TransactionState, ...]
