"""Payment events and their generator.

An event is a JSON object on the input topic, keyed by account:

    {"payment_id": "pay-7-000042", "account": "acct-03", "amount_cents": 12950,
     "flight": "OF104", "seat": "14C", "status": "captured"}

The generator writes a seeded workload with a transactional producer: some transactions are aborted
(their events must never count) and some events are invalid on purpose (the pipeline rejects them).
The workload knows by construction what a correct pipeline must output, so tests and the demo check
the pipeline against it rather than against a second copy of its own validation.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.admin.confluent import kafka_error_text
from onceflow.admin.errors import AdminError

INPUT_TOPIC = "payments"
ORDER_STATUS_TOPIC = "order-status"
SEAT_RESERVATIONS_TOPIC = "seat-reservations"
REJECTED_TOPIC = "payments-rejected"
CAPTURED = "captured"
OUTPUT_PARTITIONS = 3
TIMEOUT_S = 60.0

# Ways an event can be invalid; each one breaks exactly one rule of the pipeline's validation.
INVALID_KINDS = (
    "not-json",
    "no-account",
    "negative-amount",
    "amount-not-integer",
    "unknown-status",
    "no-seat",
)


@dataclass(frozen=True)
class Event:
    payment_id: str
    account: str
    amount_cents: int
    value: bytes
    valid: bool


@dataclass
class Transaction:
    events: list[Event]
    commit: bool


@dataclass
class Workload:
    """Transactions in the order the generator writes them; aborted ones must leave no trace."""

    seed: int
    transactions: list[Transaction] = field(default_factory=list)

    def committed(self) -> list[Event]:
        return [event for txn in self.transactions if txn.commit for event in txn.events]

    def expected_balances(self) -> Counter[str]:
        """Per account, the sum in cents of the valid payments of committed transactions."""
        balances: Counter[str] = Counter()
        for event in self.committed():
            if event.valid:
                balances[event.account] += event.amount_cents
        return balances

    def expected_payments(self) -> set[str]:
        """Payment ids that must appear exactly once on order-status and on seat-reservations."""
        return {event.payment_id for event in self.committed() if event.valid}

    def expected_rejected(self) -> int:
        return sum(not event.valid for event in self.committed())

    def aborted_payments(self) -> set[str]:
        return {event.payment_id for txn in self.transactions if not txn.commit for event in txn.events}


def make_workload(
    count: int, seed: int, accounts: int = 20, abort_ratio: float = 0.1, invalid_ratio: float = 0.05
) -> Workload:
    """`count` events in transactions of 1 to 20 events; the seed also names the payment ids, so
    workloads of different seeds can go to one topic."""
    rng = random.Random(seed)
    workload = Workload(seed)
    number = 0
    while number < count:
        size = min(rng.randint(1, 20), count - number)
        events = []
        for _ in range(size):
            payment_id = f"pay-{seed}-{number:06d}"
            number += 1
            account = f"acct-{rng.randrange(accounts):02d}"
            amount = rng.randint(100, 50_000)
            payment = {
                "payment_id": payment_id,
                "account": account,
                "amount_cents": amount,
                "flight": f"OF{rng.randint(100, 120)}",
                "seat": f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}",
                "status": CAPTURED,
            }
            if rng.random() < invalid_ratio:
                events.append(Event(payment_id, account, amount, spoil(payment, rng), valid=False))
            else:
                events.append(Event(payment_id, account, amount, json.dumps(payment).encode(), valid=True))
        workload.transactions.append(Transaction(events, commit=rng.random() >= abort_ratio))
    return workload


def spoil(payment: dict[str, object], rng: random.Random) -> bytes:
    kind = rng.choice(INVALID_KINDS)
    broken = dict(payment)
    if kind == "not-json":
        return b"{payment " + str(payment["payment_id"]).encode()
    if kind == "no-account":
        del broken["account"]
    elif kind == "negative-amount":
        broken["amount_cents"] = -int(str(broken["amount_cents"]))
    elif kind == "amount-not-integer":
        broken["amount_cents"] = f"{int(str(broken['amount_cents'])) / 100:.2f} EUR"
    elif kind == "unknown-status":
        broken["status"] = "pending"
    else:
        broken["seat"] = ""
    return json.dumps(broken).encode()


def ensure_topics(bootstrap: str, topics: dict[str, int]) -> None:
    """Create the topics that do not exist yet, with the given partition counts."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=TIMEOUT_S).topics
    wanted = [NewTopic(name, count, -1) for name, count in topics.items() if name not in existing]
    if not wanted:
        return
    for name, future in admin.create_topics(wanted, request_timeout=TIMEOUT_S).items():
        try:
            future.result(timeout=TIMEOUT_S)
        except KafkaException as error:
            # Another process may have created it since the listing, which is just as good.
            if "already exists" not in kafka_error_text(error).lower():
                raise AdminError(f"cannot create topic {name!r}: {kafka_error_text(error)}") from error


def ensure_output_topics(bootstrap: str) -> None:
    ensure_topics(
        bootstrap,
        {topic: OUTPUT_PARTITIONS for topic in (ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC, REJECTED_TOPIC)},
    )


def produce_workload(
    bootstrap: str, workload: Workload, topic: str = INPUT_TOPIC, partitions: int = 4
) -> None:
    """Write the workload with one transactional producer, aborting the transactions it says to."""
    ensure_topics(bootstrap, {topic: partitions})
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"onceflow-pipeline-generator-{workload.seed}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    for txn in workload.transactions:
        producer.begin_transaction()
        for event in txn.events:
            producer.produce(topic, key=event.account.encode(), value=event.value)
            producer.poll(0)
        if txn.commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.flush(TIMEOUT_S)  # the records reach the log, so aborting really has work to undo
            producer.abort_transaction(TIMEOUT_S)


def generate(bootstrap: str, count: int, seed: int, partitions: int = 4) -> Workload:
    """Make the seeded workload and write it to the input topic."""
    workload = make_workload(count, seed)
    produce_workload(bootstrap, workload, partitions=partitions)
    return workload
