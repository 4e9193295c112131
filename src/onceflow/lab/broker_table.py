"""`onceflow lab broker-table`: the documents' broker table, measured on a 3-broker cluster.

ZooKeeper and three `onceflow broker --zookeeper` processes on 127.0.0.1, every topic with
replication factor 3 and led by broker 1. Real confluent-kafka producers write values one by one;
each value acknowledged is read back after the faults or reported lost by the lab's checker.

The broker-side faults:
- `follower-lag`: the followers fall behind the leader: stopped (SIGSTOP, still in the ISR) in
  the acks rows; SIGKILLed until the leader is alone in the ISR in the election rows, and
  started again only once the leader is gone.
- `leader-crash`: the leader is SIGKILLed while it holds values the followers lack.
- `unclean-election`: `unclean.leader.election.enable=true`, so a replica outside the ISR may lead.
- `coordinator-crash`: the broker coordinating a transactional producer (the leader of its
  partition of `__transaction_state`) is SIGKILLed while a transaction of it is open.

Three faults, five rows: the acks rows share the first (a topic each), the election rows the
second, the exactly-once row the third; it also counts duplicates and reads of aborted values
against its prediction.
A row whose fault did not create its precondition (nothing written, or acknowledged, during the
lag; for a "may lose" row, nothing lost) is "not tested", which fails the run as a disagreement does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich import box
from rich.console import Console
from rich.table import Table

from onceflow.cluster.zk import read_cluster
from onceflow.cluster.zookeeper_server import ZooKeeperServer
from onceflow.coordinator.transaction import TRANSACTION_LOG
from onceflow.faults.broker_process import BrokerProcess, paused, wait_until
from onceflow.lab.checker import check
from onceflow.lab.history import Event

# The broker-side faults: name, as the table shows it, what it does.
FAULTS = {
    "follower-lag": ("lag", "followers stop (SIGSTOP), or die until out of the ISR"),
    "leader-crash": ("crash", "the leader SIGKILLed with values the followers lack"),
    "unclean-election": ("unclean", "a replica outside the ISR may lead"),
    "coordinator-crash": ("coord", "the transaction coordinator's broker SIGKILLed with a transaction open"),
}
COORDINATOR = 2  # the exactly-once row's transactional id is coordinated by broker 2, not the leader
BROKER_IDS = (1, 2, 3)
LEADER = 1  # every topic's assignment is [1, 2, 3]: broker 1 leads it
# Sessions of 4 s (the longest the lab's ZooKeeper, ticks of 200 ms, allows): a stopped follower
# keeps its session, and its place in the ISR (replica.lag.time.max.ms stays 30 s), while the
# leader takes the writes it misses.
SETTINGS = {"zookeeper.session.timeout.ms": "4000", "default.replication.factor": "3"}
BEFORE = 3  # values every replica has before the fault
DURING = 5  # values offered to the leader alone
WAIT_S = 60.0
ATTEMPTS = 2  # of a fault whose rows came out not tested
MAY_LOSE = "may lose"
NEVER_LOSES = "never loses"
# The clients' complaints about the brokers the faults kill: the table says what happened.
QUIET = {"log_level": 0}
AGREES, DISAGREES, NOT_TESTED = "agrees", "disagrees", "not tested"


@dataclass
class Row:
    """One row of the table: a topic's settings, the faults it went through, what was measured."""

    name: str
    topic: str
    settings: str
    faults: tuple[str, ...]
    rule: str
    prediction: str
    acks: str
    topic_configs: dict[str, str]
    history: list[Event] = field(default_factory=list)
    sent_during_fault: int = 0
    acknowledged_during_fault: int = 0
    # The loss rules are tested by values acknowledged during the fault; acks=all with
    # min.insync.replicas=2 by values offered then (which it must not acknowledge and lose).
    needs_acknowledged_during_fault: bool = True
    offline_without_leader: bool = True  # the clean row's precondition, besides its writes
    # The exactly-once row: duplicates and reads of aborted values break its prediction too;
    # the values of the transactions its producer aborted, which no read may return.
    exactly_once: bool = False
    aborted_values: list[str] = field(default_factory=list)

    def untested_because(self) -> str | None:
        """Why the fault tested none of the row's prediction, if it did not (as far as the writes
        show; `to_json` adds a "may lose" row that lost nothing)."""
        if not self.sent_during_fault:
            return "nothing was written during the fault"
        if self.needs_acknowledged_during_fault and not self.acknowledged_during_fault:
            return "nothing was acknowledged during the fault"
        if not self.offline_without_leader:
            return "the partition did not go offline without its leader"
        return None

    def to_json(self) -> dict[str, Any]:
        result = check(self.history, input_topic=self.topic, output_topic="")
        lost = sorted(value for anomaly in result.of_kind("lost-write") for value in anomaly.values)
        untested = self.untested_because()
        if not untested and self.prediction == MAY_LOSE and not lost:
            # Losing nothing keeps a "may lose" promise, but shows nothing: the followers had
            # every acknowledged value when the leader died, so the fault missed its point.
            untested = "no acknowledged value was the leader's alone when it died"
        read = {
            value for event in self.history if event["type"] == "read" for _, _, value in event["records"]
        }
        aborted_read = sorted(read & set(self.aborted_values))
        duplicated = sorted({value for anomaly in result.of_kind("duplicate") for value in anomaly.values})
        if self.exactly_once and not untested and not self.aborted_values:
            untested = "no transaction was aborted: reading aborted values was not tested"
        if untested:
            verdict = NOT_TESTED
        elif (self.prediction == NEVER_LOSES and lost) or (
            self.exactly_once and (duplicated or aborted_read)
        ):
            verdict = DISAGREES
        else:
            verdict = AGREES
        return {
            "row": self.name,
            "topic": self.topic,
            "settings": self.settings,
            "faults": list(self.faults),
            "rule": self.rule,
            "prediction": self.prediction,
            "sent": result.produced,
            "acknowledged": result.acknowledged,
            "sent_during_fault": self.sent_during_fault,
            "acknowledged_during_fault": self.acknowledged_during_fault,
            "lost": len(lost),
            "lost_values": lost,
            "duplicated_values": duplicated,
            "aborted_read_values": aborted_read,
            "verdict": verdict,
            "agrees": verdict == AGREES,
            "not_tested_because": untested,
            "anomalies": [anomaly.to_json() for anomaly in result.anomalies],
        }


def rows_to_run(attempt: int = 1) -> list[Row]:
    """The five rows; a later attempt writes to topics of its own."""
    rows = _rows()
    if attempt > 1:
        for row in rows:
            row.topic = f"{row.topic}-{attempt}"
    return rows


def _rows() -> list[Row]:
    lag_crash = ("follower-lag", "leader-crash")
    election = (*lag_crash, "unclean-election")
    return [
        Row(
            "acks=1",
            "acks-1",
            "acks=1, min.insync.replicas=1",
            lag_crash,
            "the leader's append is enough: a failover loses what only it had",
            MAY_LOSE,
            "1",
            {"min.insync.replicas": "1"},
        ),
        Row(
            "acks=all,isr>=2",
            "acks-all",
            "acks=all, min.insync.replicas=2",
            lag_crash,
            "an ack waits for a second copy: writes during the lag go unanswered",
            NEVER_LOSES,
            "all",
            {"min.insync.replicas": "2"},
            needs_acknowledged_during_fault=False,
        ),
        Row(
            "unclean",
            "unclean",
            "acks=all, min.insync.replicas=1, unclean.leader.election.enable=true",
            election,
            "a stale replica leads: what only the old leader had is cut",
            MAY_LOSE,
            "all",
            {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        ),
        Row(
            "clean",
            "clean",
            "acks=all, min.insync.replicas=1, unclean.leader.election.enable=false",
            lag_crash,
            "offline until an ISR member returns: nothing is lost",
            NEVER_LOSES,
            "all",
            {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"},
        ),
        Row(
            "exactly-once",
            "exactly-once",
            "transactions, acks=all, min.insync.replicas=2; __transaction_state with 3 replicas",
            ("coordinator-crash",),
            "the coordinator's partition fails over: its new leader has the open transaction",
            NEVER_LOSES,
            "all",
            {"min.insync.replicas": "2"},
            exactly_once=True,
        ),
    ]


class Cluster:
    """ZooKeeper and three brokers, each with its data dir and log under `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.zookeeper = ZooKeeperServer(directory=workdir / "zookeeper")
        self.workdir = workdir
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self) -> Cluster:
        self.zookeeper.start()
        for broker_id in BROKER_IDS:
            zookeeper = ["--zookeeper", self.zookeeper.connect_string, "--broker-id", str(broker_id)]
            self.brokers[broker_id] = BrokerProcess(
                self.workdir / f"broker-{broker_id}",
                SETTINGS,
                self.workdir / f"broker-{broker_id}.log",
                extra_args=zookeeper,
            )
        with ThreadPoolExecutor(len(BROKER_IDS)) as pool:
            list(pool.map(BrokerProcess.start, self.brokers.values()))
        wait_until(lambda: self.known_to_all(BROKER_IDS), WAIT_S, 0.1)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.zookeeper.stop()

    def live(self) -> list[int]:
        return [i for i, broker in self.brokers.items() if broker.process and broker.process.poll() is None]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.brokers[broker_id].address for broker_id in self.live())

    def metadata(self, topic: str | None = None) -> Any:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **QUIET})
        return admin.list_topics(topic, timeout=5)

    def views(self) -> list[set[int]] | None:
        """The brokers each live broker knows of, None while one does not answer. A broker's
        view follows ZooKeeper's a little later, and the one that takes a CreateTopics refuses
        an assignment naming a broker it does not know yet."""
        views = []
        for broker_id in self.live():
            admin = AdminClient({"bootstrap.servers": self.brokers[broker_id].address, **QUIET})
            try:
                views.append(set(admin.list_topics(timeout=5).brokers))
            except KafkaException:
                return None
        return views

    def known_to_all(self, broker_ids: Iterable[int]) -> bool:
        views = self.views()
        return views is not None and all(set(broker_ids) <= view for view in views)

    def gone_from_all(self, broker_ids: Iterable[int]) -> bool:
        views = self.views()
        return views is not None and not any(set(broker_ids) & view for view in views)

    def partition(self, topic: str) -> Any:
        described = self.metadata(topic).topics[topic]
        return None if described.error is not None else described.partitions[0]

    def wait_for_leader(self, topic: str, leader: Callable[[int], bool]) -> int:
        def led() -> bool:
            state = self.partition(topic)
            return state is not None and state.leader in self.live() and leader(state.leader)

        wait_until(led, WAIT_S, 0.1)
        return int(self.partition(topic).leader)

    def wait_for_isr(self, topic: str, isr: tuple[int, ...]) -> None:
        """Until the ISR is `isr`: the leader drops a follower once ZooKeeper ends its session."""

        def shrunk() -> bool:
            state = self.partition(topic)
            return state is not None and tuple(state.isrs) == isr

        wait_until(shrunk, WAIT_S, 0.1)

    def kill(self, broker_ids: Sequence[int]) -> None:
        for broker_id in broker_ids:
            self.brokers[broker_id].kill()

    def restart(self, broker_ids: Sequence[int]) -> None:
        """On the same ports and data dirs, once ZooKeeper has ended their old sessions."""
        wait_until(lambda: self.gone_from_all(broker_ids), WAIT_S, 0.1)
        for broker_id in broker_ids:
            self.brokers[broker_id].start()
        wait_until(lambda: self.known_to_all(broker_ids), WAIT_S, 0.1)


def run_broker_table(workdir: Path, log: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """The five rows, measured on a cluster of their own that lives as long as this call. A
    fault whose rows come out not tested, and none disagreeing, is injected once more, on
    topics of its own: the rows then say so (`attempts`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    faults = [
        ("followers lag, the leader crashes (acks=1, acks=all)", _lag_then_leader_crash, slice(0, 2)),
        (
            "the leader alone in the ISR crashes (unclean and clean election)",
            _leader_alone_crashes,
            slice(2, 4),
        ),
        ("a transaction's coordinator crashes (exactly-once)", _coordinator_crash, slice(4, 5)),
    ]
    table: list[dict[str, Any]] = []
    histories: dict[str, list[Event]] = {}
    cluster = Cluster(workdir)
    try:
        log("broker table: starting ZooKeeper and 3 brokers")
        cluster.start()
        for what, inject, part in faults:
            for attempt in range(1, ATTEMPTS + 1):
                rows = rows_to_run(attempt)[part]
                log(f"broker table: {what}" + (f", attempt {attempt}" if attempt > 1 else ""))
                inject(cluster, rows)
                histories.update({row.topic: row.history for row in rows})
                judged = [{**row.to_json(), "attempts": attempt} for row in rows]
                if settled(judged):
                    break
            table += judged
    finally:
        cluster.stop()
    (workdir / "history.json").write_text(json.dumps(histories) + "\n")
    return table


def settled(judged: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a fault's rows stand: each tested, or one disagreeing, which is a finding that
    another attempt must not replace."""
    verdicts = [row["verdict"] for row in judged]
    return NOT_TESTED not in verdicts or DISAGREES in verdicts


def print_table(rows: Sequence[Mapping[str, Any]], console: Console | None = None) -> None:
    """A row per setting: the faults, acknowledged (during the fault), lost, the prediction and
    whether the measurement agrees; then each row's settings and rule. Fits 80 columns."""
    table = Table(title="broker table: 3 brokers, replication factor 3", box=box.SIMPLE_HEAD, padding=(0, 1))
    for column in ("row", "faults", "acked", "lost", "predicted", "agrees"):
        table.add_column(column, no_wrap=True)
    shown = {AGREES: "[green]yes[/]", DISAGREES: "[bold red]NO[/]", NOT_TESTED: "[yellow]n/t[/]"}
    for row in rows:
        table.add_row(
            row["row"],
            ",".join(FAULTS[fault][0] for fault in row["faults"]),
            f"{row['acknowledged']} ({row['acknowledged_during_fault']})",
            f"[bold]{row['lost']}[/]" if row["lost"] else "0",
            row["prediction"],
            shown[row["verdict"]],
        )
    console = console or Console()
    console.print(table)
    for row in rows:
        console.print(f"  {row['row']}: {row['settings']}\n    {row['rule']}", highlight=False)
    for name, (short, does) in FAULTS.items():
        console.print(f"  {short} = {name}: {does}", highlight=False)
    console.print("  acked (n): n of them during the fault; n/t: not tested", highlight=False)
    for row in rows:
        if row.get("attempts", 1) > 1:
            console.print(f"  {row['row']}: measured at attempt {row['attempts']}", highlight=False)


def problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The rows that break the documents' prediction or tested nothing, as sentences."""
    found = []
    for row in rows:
        if row["verdict"] == DISAGREES:
            found.append(
                f"broker table, {row['row']}: lost {row['lost']} acknowledged, predicted to lose none"
            )
        elif row["verdict"] == NOT_TESTED:
            found.append(f"broker table, {row['row']}: not tested ({row['not_tested_because']})")
    return found


def _lag_then_leader_crash(cluster: Cluster, rows: list[Row]) -> None:
    """Followers SIGSTOPped while the leader takes writes, the leader SIGKILLed, the followers
    resumed: a follower that has not the values becomes leader (cleanly: it is in the ISR)."""
    _create(cluster, rows)
    for row in rows:
        _write(cluster, row, [f"before-{index}" for index in range(BEFORE)])
    followers = [broker_id for broker_id in BROKER_IDS if broker_id != LEADER]
    processes = [cluster.brokers[broker_id].process for broker_id in followers]
    with paused([process for process in processes if process is not None]):
        for row in rows:
            _write(cluster, row, [f"during-{index}" for index in range(DURING)], during_fault=True)
        cluster.kill([LEADER])
    for row in rows:
        cluster.wait_for_leader(row.topic, lambda leader: leader != LEADER)
        _read_back(cluster, row)
    cluster.restart([LEADER])


def _leader_alone_crashes(cluster: Cluster, rows: list[Row]) -> None:
    """Followers SIGKILLed until the leader is alone in the ISR, writes acknowledged by it alone,
    the leader SIGKILLed, the followers started again (stale): with unclean election one of them
    leads (`rows[0]`); without, the partition waits offline for the old leader (`rows[1]`)."""
    unclean, clean = rows
    _create(cluster, rows)
    for row in rows:
        _write(cluster, row, [f"before-{index}" for index in range(BEFORE)])
    followers = [broker_id for broker_id in BROKER_IDS if broker_id != LEADER]
    cluster.kill(followers)
    for row in rows:
        cluster.wait_for_isr(row.topic, (LEADER,))
        _write(cluster, row, [f"during-{index}" for index in range(DURING)], during_fault=True)
    cluster.kill([LEADER])
    cluster.restart(followers)
    cluster.wait_for_leader(unclean.topic, lambda leader: leader != LEADER)
    _read_back(cluster, unclean)
    state = cluster.partition(clean.topic)
    if state is None or state.leader != -1:
        clean.offline_without_leader = False
    cluster.restart([LEADER])
    cluster.wait_for_leader(clean.topic, lambda leader: leader == LEADER)
    _read_back(cluster, clean)


def _coordinator_crash(cluster: Cluster, rows: list[Row]) -> None:
    """A transactional producer commits values, aborts some, then has a transaction open (its
    values in the log) when the broker coordinating it is SIGKILLed; it commits that transaction
    through the new coordinator, and one more. Every committed value must be read once, no
    aborted one ever."""
    (row,) = rows
    _create(cluster, rows)
    transactional_id = _coordinated_by(cluster, COORDINATOR, row.topic)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, **QUIET, "transactional.id": transactional_id}
    )
    producer.init_transactions(WAIT_S)
    _transaction(producer, row, [f"before-{index}" for index in range(BEFORE)], commit=True)
    _transaction(producer, row, [f"aborted-{index}" for index in range(BEFORE)], commit=False)
    producer.begin_transaction()
    during = [f"during-{index}" for index in range(DURING)]
    _send(producer, row, during)  # in the log: the transaction is open at the kill
    row.sent_during_fault += len(during)
    cluster.kill([COORDINATOR])
    if _finish(producer, row, during, commit=True):
        row.acknowledged_during_fault += len(during)
    _transaction(producer, row, ["after"], commit=True)
    _read_committed(cluster, row)
    cluster.restart([COORDINATOR])


def _coordinated_by(cluster: Cluster, broker_id: int, prefix: str) -> str:
    """A transactional id whose coordinator is `broker_id` (its first lookup creates
    `__transaction_state`, once the three brokers are live)."""
    Producer(
        {"bootstrap.servers": cluster.bootstrap, **QUIET, "transactional.id": f"{prefix}-probe"}
    ).init_transactions(WAIT_S)
    view = read_cluster(cluster.zookeeper.connect_string, WAIT_S)
    candidates = (f"{prefix}-{number}" for number in range(1000))
    return next(tid for tid in candidates if view.coordinator(TRANSACTION_LOG, tid) == broker_id)


def _send(producer: Producer, row: Row, values: list[str]) -> None:
    for value in values:
        row.history.append(_event("producer", "send", topic=row.topic, value=value))
        producer.produce(row.topic, value.encode(), partition=0)
    producer.flush(WAIT_S)


def _transaction(producer: Producer, row: Row, values: list[str], commit: bool) -> None:
    producer.begin_transaction()
    _send(producer, row, values)
    _finish(producer, row, values, commit)


def _finish(producer: Producer, row: Row, values: list[str], commit: bool) -> bool:
    """Commit (acks for every value once the broker confirms it) or abort the open transaction;
    a commit refused with an abortable error aborts. Whether it committed."""
    if commit:
        try:
            producer.commit_transaction(WAIT_S)
        except KafkaException as error:
            if not error.args[0].txn_requires_abort():
                raise
        else:
            row.history += [
                _event("producer", "ack", topic=row.topic, value=value, partition=0, offset=None)
                for value in values
            ]
            return True
    producer.abort_transaction(WAIT_S)
    row.aborted_values += values
    return False


def _read_committed(cluster: Cluster, row: Row) -> None:
    """Every committed record, read_committed, up to the last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            **QUIET,
            "group.id": f"broker-table-{row.topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    records: list[list[Any]] = []
    try:
        consumer.assign([TopicPartition(row.topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                records.append([0, message.offset(), (message.value() or b"").decode()])
            elif error.code() == KafkaError._PARTITION_EOF:
                break
        end = consumer.position([TopicPartition(row.topic, 0)])[0].offset
    finally:
        consumer.close()
    row.history.append(
        _event(
            "reader", "read", topic=row.topic, isolation="read_committed", records=records, ends=[[0, end]]
        )
    )


def _create(cluster: Cluster, rows: list[Row]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    topics = [
        NewTopic(row.topic, 1, replica_assignment=[list(BROKER_IDS)], config=row.topic_configs)
        for row in rows
    ]
    for future in admin.create_topics(topics, operation_timeout=20).values():
        future.result(timeout=30)
    for row in rows:
        cluster.wait_for_leader(row.topic, lambda leader: leader == LEADER)
        row.history.append(_event("reader", "assign", topic=row.topic, partitions=[0]))


def _write(cluster: Cluster, row: Row, values: list[str], during_fault: bool = False) -> None:
    """One value at a time, each waited for, so that a value acknowledged is on the leader's log
    before the next is sent: a follower's fetch answered at the moment of SIGSTOP may carry the
    first value of the fault, not the last. During the fault acks=all cannot be answered (the
    followers are stopped): those writes go together and time out within two seconds."""
    # During the fault only the leader answers: a client that asked a stopped follower for
    # metadata would wait out its request timeout, and the pause would run long.
    bootstrap = cluster.brokers[LEADER].address if during_fault else cluster.bootstrap
    acknowledged = _produce(bootstrap, row.topic, row.acks, values, row.history, quick=during_fault)
    if during_fault:
        row.sent_during_fault += len(values)
        row.acknowledged_during_fault += acknowledged


def _produce(
    bootstrap: str, topic: str, acks: str, values: list[str], history: list[Event], quick: bool
) -> int:
    """How many of `values` were acknowledged; sends and acks go to `history`."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **QUIET,
            "acks": acks,
            "linger.ms": 0,
            "enable.idempotence": False,
            "retries": 0,
            "request.timeout.ms": 1000 if quick else 10_000,
            "message.timeout.ms": 1500 if quick else 20_000,
        }
    )
    acknowledged = 0

    def delivered(error: KafkaError | None, message: Message) -> None:
        nonlocal acknowledged
        if error is None:
            acknowledged += 1
            value = (message.value() or b"").decode()
            history.append(
                _event("producer", "ack", topic=topic, value=value, partition=0, offset=message.offset())
            )

    together = quick and acks == "all"
    for value in values:
        history.append(_event("producer", "send", topic=topic, value=value))
        producer.produce(topic, value.encode(), partition=0, on_delivery=delivered)
        if not together:
            producer.flush(30)
    producer.flush(30)
    return acknowledged


def _high_watermark(consumer: Consumer, topic: str, deadline: float) -> int:
    """Partition 0's high watermark. A broker just started may not know the partition yet (its
    view of the cluster follows ZooKeeper's a little later): asked again until the deadline."""
    while True:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _read_back(cluster: Cluster, row: Row) -> None:
    """After the failover: one acks=all write, so that the new leader's high watermark covers its
    whole log, then every record up to it, as the checker's final read."""
    _produce(cluster.bootstrap, row.topic, "all", ["after"], [], quick=False)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            **QUIET,
            "group.id": f"broker-table-{row.topic}",
            "enable.auto.commit": False,
        }
    )
    records: list[list[Any]] = []
    try:
        deadline = time.monotonic() + WAIT_S
        end = _high_watermark(consumer, row.topic, deadline)
        consumer.assign([TopicPartition(row.topic, 0, 0)])
        while (not records or records[-1][1] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append([0, message.offset(), (message.value() or b"").decode()])
    finally:
        consumer.close()
    row.history.append(
        _event(
            "reader", "read", topic=row.topic, isolation="read_committed", records=records, ends=[[0, end]]
        )
    )


def _event(process: str, type_: str, **fields: Any) -> Event:
    """In the shape of `history.HistoryWriter`'s lines, which the checker reads."""
    return {"time": round(time.time(), 6), "process": process, "type": type_, **fields}
