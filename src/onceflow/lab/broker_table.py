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

The rows are data (`ROWS`): each names the fault scenario it goes through (`SCENARIOS`), and the
rows of one scenario share one injection of it, a topic each. Adding a row is one more `Row` in
`ROWS`, and a scenario in `SCENARIOS` when it needs a fault of its own.

Predictions: "may lose" (acks=1, an unclean election), "never loses" (acks=all with
min.insync.replicas=2, a clean election, the exactly-once row), "refuses" (acks=all while fewer
than min.insync.replicas are in sync: NOT_ENOUGH_REPLICAS, never an acknowledgement). The
exactly-once row also counts duplicates and reads of aborted values against its prediction. A row
whose fault did not create its precondition (nothing written, or acknowledged, during the fault;
for a "may lose" row, nothing lost; for the exactly-once row, nothing aborted) is "not tested",
which fails the run as a disagreement does.

Each row's history holds its sends, acks and refusals, the fault's steps (`fault` events with an
`action`, see `FAULT_BANDS`) and the final read, so the report can draw it on a timeline.
"""

from __future__ import annotations

import dataclasses
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

from onceflow.cluster.zookeeper_server import ZooKeeperServer
from onceflow.faults.broker_process import BrokerProcess, paused, wait_until
from onceflow.internal_topics import TRANSACTION_LOG
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
REFUSES = "refuses"
# The errors of an acks=all write refused for want of in-sync replicas.
REFUSALS = ("NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND")
# A fault's steps as the rows' histories record them: the band each pair draws on the timeline.
FAULT_BANDS = {
    "followers-stopped": ("followers stopped (SIGSTOP)", "followers-resumed"),
    "followers-killed": ("followers down (SIGKILL)", "followers-restarted"),
    "leader-killed": ("leader down (SIGKILL)", "leader-restarted"),
    "coordinator-killed": ("coordinator down (SIGKILL)", "coordinator-restarted"),
}
# The clients' complaints about the brokers the faults kill: the table says what happened.
QUIET = {"log_level": 0}
AGREES, DISAGREES, NOT_TESTED = "agrees", "disagrees", "not tested"


@dataclass
class Row:
    """One row of the table: a topic's settings, the faults it went through, what was measured."""

    name: str
    topic: str
    settings: str
    scenario: str  # a key of SCENARIOS
    faults: tuple[str, ...]
    rule: str
    prediction: str
    acks: str
    topic_configs: dict[str, str]
    history: list[Event] = field(default_factory=list)
    sent_during_fault: int = 0
    acknowledged_during_fault: int = 0
    refused_during_fault: int = 0
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
        if self.prediction == REFUSES:
            return None  # an acknowledgement during the fault would break the prediction
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
        elif (self.prediction in (NEVER_LOSES, REFUSES) and lost) or (
            self.exactly_once and (duplicated or aborted_read)
        ):
            verdict = DISAGREES
        elif self.prediction == REFUSES and (
            self.acknowledged_during_fault or self.refused_during_fault < self.sent_during_fault
        ):
            verdict = DISAGREES  # acknowledged with too few copies, or left unanswered
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
            "refused_during_fault": self.refused_during_fault,
            "lost": len(lost),
            "lost_values": lost,
            "duplicated_values": duplicated,
            "aborted_read_values": aborted_read,
            "verdict": verdict,
            "agrees": verdict == AGREES,
            "not_tested_because": untested,
            "anomalies": [anomaly.to_json() for anomaly in result.anomalies],
            "picture": picture(self.history, self.topic, lost),
        }


LAG_THEN_CRASH, LEADER_ALONE_CRASHES = "lag-then-crash", "leader-alone-crashes"
COORDINATOR_CRASH = "coordinator-crash"
LAG_CRASH = ("follower-lag", "leader-crash")
ROWS = (
    Row(
        "acks=1",
        "acks-1",
        "acks=1, min.insync.replicas=1",
        LAG_THEN_CRASH,
        LAG_CRASH,
        "the leader's append is enough: a failover loses what only it had",
        MAY_LOSE,
        "1",
        {"min.insync.replicas": "1"},
    ),
    Row(
        "acks=all,isr>=2",
        "acks-all",
        "acks=all, min.insync.replicas=2",
        LAG_THEN_CRASH,
        LAG_CRASH,
        "an ack waits for a second copy: writes during the lag go unanswered",
        NEVER_LOSES,
        "all",
        {"min.insync.replicas": "2"},
        needs_acknowledged_during_fault=False,
    ),
    Row(
        "acks=all,1 in sync",
        "acks-all-alone",
        "acks=all, min.insync.replicas=2, the leader alone in the ISR",
        LEADER_ALONE_CRASHES,
        LAG_CRASH,
        "fewer in sync than min.insync.replicas: refused with NOT_ENOUGH_REPLICAS, never acknowledged",
        REFUSES,
        "all",
        {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"},
    ),
    Row(
        "unclean",
        "unclean",
        "acks=all, min.insync.replicas=1, unclean.leader.election.enable=true",
        LEADER_ALONE_CRASHES,
        (*LAG_CRASH, "unclean-election"),
        "a stale replica leads: what only the old leader had is cut",
        MAY_LOSE,
        "all",
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    ),
    Row(
        "clean",
        "clean",
        "acks=all, min.insync.replicas=1, unclean.leader.election.enable=false",
        LEADER_ALONE_CRASHES,
        LAG_CRASH,
        "offline until an ISR member returns: nothing is lost",
        NEVER_LOSES,
        "all",
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"},
    ),
    Row(
        "exactly-once",
        "exactly-once",
        "transactions, acks=all, min.insync.replicas=2; __transaction_state with 3 replicas",
        COORDINATOR_CRASH,
        ("coordinator-crash",),
        "the coordinator's partition fails over: its new leader has the open transaction",
        NEVER_LOSES,
        "all",
        {"min.insync.replicas": "2"},
        exactly_once=True,
    ),
)


def rows_to_run(attempt: int = 1) -> list[Row]:
    """Fresh rows to measure; a later attempt writes to topics of its own."""
    suffix = f"-{attempt}" if attempt > 1 else ""
    return [
        dataclasses.replace(row, topic=f"{row.topic}{suffix}", history=[], aborted_values=[]) for row in ROWS
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
        wait_until(lambda: self.known_to_all(BROKER_IDS), WAIT_S, 0.1, what="3 brokers that know each other")
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
        """Partition 0 of `topic` as the metadata describes it, None while no broker answers or the
        answer does not have it yet (a broker's view follows ZooKeeper's a little later)."""
        try:
            described = self.metadata(topic).topics.get(topic)
        except KafkaException:
            return None
        if described is None or described.error is not None:
            return None
        return described.partitions.get(0)

    def wait_for_leader(self, topic: str, leader: Callable[[int], bool]) -> int:
        """The leader of `topic` once one that `leader` accepts is live: the one the check saw."""
        seen: list[int] = []

        def led() -> bool:
            state = self.partition(topic)
            if state is None or state.leader not in self.live() or not leader(state.leader):
                return False
            seen.append(int(state.leader))
            return True

        wait_until(led, WAIT_S, 0.1, what=f"a new leader of {topic}")
        return seen[-1]

    def wait_for_state(self, topic: str) -> Any:
        """Partition 0 of `topic` as the first answer that has it describes it."""
        seen: list[Any] = []

        def described() -> bool:
            seen.append(self.partition(topic))
            return seen[-1] is not None

        wait_until(described, WAIT_S, 0.1, what=f"the metadata of {topic}")
        return seen[-1]

    def wait_for_isr(self, topic: str, isr: tuple[int, ...]) -> None:
        """Until the ISR is `isr`: the leader drops a follower once ZooKeeper ends its session."""

        def shrunk() -> bool:
            state = self.partition(topic)
            return state is not None and tuple(state.isrs) == isr

        wait_until(shrunk, WAIT_S, 0.1, what=f"the ISR of {topic} to be {list(isr)}")

    def kill(self, broker_ids: Sequence[int]) -> None:
        for broker_id in broker_ids:
            self.brokers[broker_id].kill()

    def restart(self, broker_ids: Sequence[int]) -> None:
        """On the same ports and data dirs, once ZooKeeper has ended their old sessions."""
        names = ", ".join(f"broker {broker_id}" for broker_id in broker_ids)
        wait_until(lambda: self.gone_from_all(broker_ids), WAIT_S, 0.1, what=f"ZooKeeper to drop {names}")
        for broker_id in broker_ids:
            self.brokers[broker_id].start()
        wait_until(lambda: self.known_to_all(broker_ids), WAIT_S, 0.1, what=f"every broker to know {names}")


def run_broker_table(workdir: Path, log: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Every row, measured on a cluster of its own that lives as long as this call, the rows of
    one scenario under one injection of it. A scenario whose rows come out not tested, and none
    disagreeing, is injected once more, on topics of its own: the rows then say so (`attempts`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    table: list[dict[str, Any]] = []
    histories: dict[str, list[Event]] = {}
    cluster = Cluster(workdir)
    try:
        log("broker table: starting ZooKeeper and 3 brokers")
        cluster.start()
        for key in dict.fromkeys(row.scenario for row in ROWS):
            scenario = SCENARIOS[key]
            for attempt in range(1, ATTEMPTS + 1):
                rows = [row for row in rows_to_run(attempt) if row.scenario == key]
                log(f"broker table: {scenario.what}" + (f", attempt {attempt}" if attempt > 1 else ""))
                scenario.inject(cluster, rows)
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
    for column in ("row", "faults", "acked", "refused", "lost", "predicted", "agrees"):
        table.add_column(column, no_wrap=True)
    shown = {AGREES: "[green]yes[/]", DISAGREES: "[bold red]NO[/]", NOT_TESTED: "[yellow]n/t[/]"}
    for row in rows:
        table.add_row(
            row["row"],
            ",".join(FAULTS[fault][0] for fault in row["faults"]),
            f"{row['acknowledged']} ({row['acknowledged_during_fault']})",
            str(row["refused_during_fault"]),
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
    console.print(
        "  acked (n): n of them during the fault; refused: during the fault, with NOT_ENOUGH_REPLICAS;"
        " n/t: not tested",
        highlight=False,
    )
    for row in rows:
        if row.get("attempts", 1) > 1:
            console.print(f"  {row['row']}: measured at attempt {row['attempts']}", highlight=False)


def problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The rows that break the documents' prediction or tested nothing, as sentences."""
    found = []
    for row in rows:
        if row["verdict"] == DISAGREES and row["prediction"] == REFUSES and not row["lost"]:
            found.append(
                f"broker table, {row['row']}: {row['acknowledged_during_fault']} acknowledged and"
                f" {row['refused_during_fault']} refused of {row['sent_during_fault']} sent with one replica"
                " in sync, predicted all refused"
            )
        elif row["verdict"] == DISAGREES:
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
        _mark(rows, "followers-stopped")
        for row in rows:
            _write(cluster, row, [f"during-{index}" for index in range(DURING)], during_fault=True)
        cluster.kill([LEADER])
        _mark(rows, "leader-killed")
    _mark(rows, "followers-resumed")
    for row in rows:
        cluster.wait_for_leader(row.topic, lambda leader: leader != LEADER)
        _read_back(cluster, row)
    cluster.restart([LEADER])
    _mark(rows, "leader-restarted")


def _leader_alone_crashes(cluster: Cluster, rows: list[Row]) -> None:
    """Followers SIGKILLed until the leader is alone in the ISR, writes to it alone, the leader
    SIGKILLed, the followers started again (stale): with unclean election one of them leads; without,
    the partition waits offline for the old leader."""
    _create(cluster, rows)
    for row in rows:
        _write(cluster, row, [f"before-{index}" for index in range(BEFORE)])
    followers = [broker_id for broker_id in BROKER_IDS if broker_id != LEADER]
    cluster.kill(followers)
    _mark(rows, "followers-killed")
    for row in rows:
        cluster.wait_for_isr(row.topic, (LEADER,))
        _write(cluster, row, [f"during-{index}" for index in range(DURING)], during_fault=True)
    cluster.kill([LEADER])
    _mark(rows, "leader-killed")
    cluster.restart(followers)
    _mark(rows, "followers-restarted")
    unclean = [row for row in rows if row.topic_configs.get("unclean.leader.election.enable") == "true"]
    clean = [row for row in rows if row not in unclean]
    for row in unclean:
        cluster.wait_for_leader(row.topic, lambda leader: leader != LEADER)
        _read_back(cluster, row)
    for row in clean:
        row.offline_without_leader = cluster.wait_for_state(row.topic).leader == -1
    cluster.restart([LEADER])
    _mark(rows, "leader-restarted")
    for row in clean:
        cluster.wait_for_leader(row.topic, lambda leader: leader == LEADER)
        _read_back(cluster, row)


def _mark(rows: list[Row], action: str) -> None:
    """A step of the fault, in every row's history."""
    for row in rows:
        row.history.append(_event("lab", "fault", action=action))


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
    _mark(rows, "coordinator-killed")
    if _finish(producer, row, during, commit=True):
        row.acknowledged_during_fault += len(during)
    _transaction(producer, row, ["after"], commit=True)
    _read_committed(cluster, row)
    cluster.restart([COORDINATOR])
    _mark(rows, "coordinator-restarted")


def _coordinated_by(cluster: Cluster, broker_id: int, prefix: str) -> str:
    """A transactional id whose coordinator is `broker_id` (its first lookup creates
    `__transaction_state`, once the three brokers are live)."""
    Producer(
        {"bootstrap.servers": cluster.bootstrap, **QUIET, "transactional.id": f"{prefix}-probe"}
    ).init_transactions(WAIT_S)
    from onceflow.cluster.zk import read_cluster  # kazoo: the cluster extra, which the demo lacks

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


@dataclass(frozen=True)
class Scenario:
    what: str  # as the progress line says it
    inject: Callable[[Cluster, list[Row]], None]


SCENARIOS = {
    LAG_THEN_CRASH: Scenario("followers lag, the leader crashes", _lag_then_leader_crash),
    LEADER_ALONE_CRASHES: Scenario("the leader alone in the ISR crashes", _leader_alone_crashes),
    COORDINATOR_CRASH: Scenario("a transaction's coordinator crashes", _coordinator_crash),
}


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
    acknowledged, refused = _produce(bootstrap, row.topic, row.acks, values, row.history, quick=during_fault)
    if during_fault:
        row.sent_during_fault += len(values)
        row.acknowledged_during_fault += acknowledged
        row.refused_during_fault += refused


def _produce(
    bootstrap: str, topic: str, acks: str, values: list[str], history: list[Event], quick: bool
) -> tuple[int, int]:
    """How many of `values` were acknowledged, and refused for want of in-sync replicas; sends,
    acks and failures go to `history`."""
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
    acknowledged = refused = 0

    def delivered(error: KafkaError | None, message: Message) -> None:
        nonlocal acknowledged, refused
        value = (message.value() or b"").decode()
        if error is None:
            acknowledged += 1
            history.append(
                _event("producer", "ack", topic=topic, value=value, partition=0, offset=message.offset())
            )
        else:
            refused += error.name() in REFUSALS
            history.append(_event("producer", "fail", topic=topic, value=value, error=error.name()))

    together = quick and acks == "all"
    for value in values:
        history.append(_event("producer", "send", topic=topic, value=value))
        producer.produce(topic, value.encode(), partition=0, on_delivery=delivered)
        if not together:
            producer.flush(30)
    producer.flush(30)
    return acknowledged, refused


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


def picture(history: Sequence[Event], topic: str, lost: Iterable[str]) -> dict[str, Any]:
    """What the report draws of a row, in seconds since its first event: each value written, when,
    and what became of it (kept, lost, refused, unanswered), the fault's steps as bands, and when
    the values were read back."""
    if not history:
        return {"duration": 0.0, "marks": [], "bands": [], "reads": []}
    start = min(event["time"] for event in history)
    duration = max(max(event["time"] for event in history) - start, 0.5)
    lost = set(lost)
    sent: dict[str, float] = {}
    acked: set[str] = set()
    refused: set[str] = set()
    bands: list[dict[str, Any]] = []
    open_bands: dict[str, dict[str, Any]] = {}
    for event in history:
        at = round(event["time"] - start, 3)
        if event["type"] == "send" and event["topic"] == topic:
            sent.setdefault(event["value"], at)
        elif event["type"] == "ack":
            acked.add(event["value"])
        elif event["type"] == "fail" and event["error"] in REFUSALS:
            refused.add(event["value"])
        elif event["type"] == "fault" and event["action"] in open_bands:
            open_bands.pop(event["action"])["end"] = at
        elif event["type"] == "fault" and event["action"] in FAULT_BANDS:
            label, end_action = FAULT_BANDS[event["action"]]
            band = {"label": label, "start": at, "end": round(duration, 3)}
            bands.append(band)
            open_bands[end_action] = band
    marks = [
        {
            "value": value,
            "at": at,
            "fate": _fate(value, lost, acked, refused),
        }
        for value, at in sent.items()
    ]
    reads = [round(event["time"] - start, 3) for event in history if event["type"] == "read"]
    return {"duration": round(duration, 3), "marks": marks, "bands": bands, "reads": reads}


def _fate(value: str, lost: set[str], acked: set[str], refused: set[str]) -> str:
    if value in lost:
        return "lost"
    if value in acked:
        return "kept"
    return "refused" if value in refused else "unanswered"
