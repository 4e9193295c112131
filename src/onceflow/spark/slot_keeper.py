"""The slot keeper: one process per Spark executor that keeps the exactly-once sink's producers.

A write slot's producer is worth keeping: building one and fencing the last (`init_transactions`)
took 28 ms at the median, with CPU taken from the tasks. A Python worker cannot keep it: Spark lends
a task the worker idle longest (`PythonWorkerFactory` queues idle workers first in, first out), so
partition p's next write task nearly always runs in another worker, which fenced the last (79 of 84
write tasks in a bench query). The keeper outlives the workers. The first exactly-once write task
of an executor starts it, named after the process that forks the executor's Python workers (the
owner), and it ends with that process. Every write task of the executor streams its rows to it over
a Unix socket, in a private directory:

    task -> keeper   (settings, prefix, partition, batch id)
    keeper -> task   SKIP if the batch already landed (the task sends nothing more), else WRITE
    task -> keeper   the task's Arrow schema and batches (IPC messages), then END
    keeper -> task   the number of records, once all of them are in the broker
    task -> keeper   COMMIT
    keeper -> task   COMMITTED

Each answer is (OK, value) or (FAILED, the exception), which the task raises. A task that fails or
goes away before COMMIT has its transaction aborted and its slot closed, not kept. A kept slot
skips the progress read and trusts its own count of the batches landed, which is safe because a
producer that another fenced fails at its next transaction: see
docs/design.md#the-spark-sinks-fencing-protocol.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import failpoints
from onceflow.spark.producing import SinkSettings, TransactionalSlot, held_slot
from onceflow.spark.task_times import StageClock

OK, FAILED = "ok", "failed"
SKIP, WRITE, COMMIT, COMMITTED = "skip", "write", "commit", "committed"
END = b""  # after a task's last batch
KEEPER_START_TIMEOUT_S = 30.0
# How soon a keeper notices that its executor is gone; it holds no state worth a faster exit.
OWNER_CHECK_INTERVAL_S = 0.5
# A slot unused this long is closed: its query stopped or its tasks run on other executors now,
# and a batch write's slots (a fresh prefix per write) are never used again.
IDLE_SLOT_TIMEOUT_S = 300.0


def keeper_directory() -> Path:
    """This user's directory of keeper sockets and locks, open to no one else."""
    directory = Path(tempfile.gettempdir()) / f"onceflow-slot-keepers-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user: the slot keeper will not use it")
    return directory


def keeper_address(owner: int) -> str:
    return str(keeper_directory() / f"{owner}.sock")


# The task's side.
_started: list[subprocess.Popen[bytes]] = []


def write_through_keeper(
    owner: int,
    settings: SinkSettings,
    prefix: str,
    partition: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
    clock: StageClock | None = None,
) -> tuple[int, bool]:
    """Write one task's batches through the keeper of process `owner`: (records, skipped)."""
    clock = clock or StageClock("write, exactly-once")
    with clock.stage("keeper's slot"):
        keeper = connect(owner)
    with keeper:
        with clock.stage("keeper's slot"):
            keeper.send((settings, prefix, partition, batch_id))
            if answer(keeper) == SKIP:
                return 0, True
        # If the keeper gives up on the write midway, its answer says why.
        with contextlib.suppress(ConnectionError):
            send_batches(keeper, batches, clock)
        with clock.stage("keeper's flush"):
            count: int = answer(keeper)
        # The moment to lose the executor: the rows are in the broker, in a transaction left open.
        failpoints.hold("spark.sink.before-transaction-commit")
        with clock.stage("commit"):
            keeper.send(COMMIT)
            answer(keeper)
        return count, False


def send_batches(
    keeper: Connection, batches: Iterable[pa.RecordBatch], clock: StageClock | None = None
) -> None:
    """The batches in Arrow's IPC format (a tenth of pickle's time), the schema first, then END."""
    clock = clock or StageClock("write, exactly-once")
    schema = None
    for batch in batches:
        with clock.stage("to the keeper"):
            if schema is None:
                schema = batch.schema
                keeper.send_bytes(schema.serialize())
            keeper.send_bytes(batch.serialize())
    keeper.send_bytes(END)


def received_batches(task: Connection) -> Iterator[pa.RecordBatch]:
    message = task.recv_bytes()
    if message == END:
        return
    schema = pa.ipc.read_schema(pa.py_buffer(message))
    while (message := task.recv_bytes()) != END:
        yield pa.ipc.read_record_batch(pa.py_buffer(message), schema)


def answer(keeper: Connection) -> Any:
    try:
        status, value = keeper.recv()
    except EOFError:
        raise RuntimeError("the slot keeper closed the connection: see the executor's log") from None
    if status == FAILED:
        raise value
    return value


def connect(owner: int) -> Connection:
    """A connection to the keeper of process `owner`, started if there is none."""
    if owner <= 1:
        raise RuntimeError("this Python worker outlived the process that started it: no keeper to follow")
    address = keeper_address(owner)
    deadline = time.monotonic() + KEEPER_START_TIMEOUT_S
    started = False
    while True:
        try:
            return Client(address, "AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if not started:
                start_keeper(owner)
                started = True
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the slot keeper did not start in {KEEPER_START_TIMEOUT_S:g} s: see the executor's log"
                ) from None
            time.sleep(0.02)


def start_keeper(owner: int) -> None:
    # Several tasks may start one at once: the first to take the lock serves, the others exit.
    # It writes to the worker's stderr, which Spark keeps in the executor's log.
    _started[:] = [keeper for keeper in _started if keeper.poll() is None]  # reaped once they end
    _started.append(
        subprocess.Popen(
            [sys.executable, "-c", f"from onceflow.spark.slot_keeper import serve; serve({owner})"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            # The modules the worker imports, even those Spark added to its path at run time.
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    )


# The keeper's side.
# Each kept slot with the time its last task ended.
_slots: dict[str, tuple[TransactionalSlot, float]] = {}
_slots_lock = threading.Lock()


def serve(owner: int) -> None:
    remove_leftovers()
    lock_path = keeper_directory() / f"{owner}.lock"
    lock = lock_path.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another keeper serves this owner
    address = keeper_address(owner)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # left by a keeper that was killed
    listener = Listener(address, "AF_UNIX")

    def leave(*_: object) -> None:
        for path in (address, lock_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # Open transactions need nothing: the next producers of their slots fence them.
        os._exit(0)

    # PySpark's daemon ends its workers with SIGHUP to its process group, which the keeper is in.
    signal.signal(signal.SIGHUP, leave)
    signal.signal(signal.SIGTERM, leave)
    threading.Thread(target=look_after, args=(owner, leave), daemon=True).start()
    while True:
        threading.Thread(target=serve_task, args=(listener.accept(),), daemon=True).start()


def remove_leftovers() -> None:
    """The socket and lock of keepers killed with their executors, whose owners are gone."""
    for lock_path in keeper_directory().glob("*.lock"):
        if lock_path.stem.isdigit() and not owner_alive(int(lock_path.stem)):
            for path in (lock_path, lock_path.with_suffix(".sock")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def look_after(owner: int, leave: Callable[[], None]) -> None:
    while owner_alive(owner):
        close_idle_slots()
        time.sleep(OWNER_CHECK_INTERVAL_S)
    leave()


def owner_alive(owner: int) -> bool:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve_task(task: Connection) -> None:
    with task:
        try:
            write_task(task, *task.recv())
        except (EOFError, ConnectionError):
            pass  # the task is gone; its slot was closed
        except BaseException as error:
            with contextlib.suppress(ConnectionError):
                task.send((FAILED, portable(error)))


def write_task(task: Connection, settings: SinkSettings, prefix: str, partition: int, batch_id: int) -> None:
    key = f"{prefix}-{partition}"
    with _slots_lock:
        kept, _ = _slots.pop(key, (None, 0.0))
    slot = held_slot(settings, prefix, partition, batch_id, kept)
    try:
        landed = slot.batches_done > batch_id
        if not landed:
            task.send((OK, WRITE))
            slot.write(batch_id, received_batches(task), lambda count: agree_to_commit(task, count))
    except BaseException:
        # A fenced, failed or half-done slot is never reused: the next attempt fences it anew.
        slot.abandon()
        raise
    keep(key, slot)
    task.send((OK, SKIP if landed else COMMITTED))


def keep(key: str, slot: TransactionalSlot) -> None:
    with _slots_lock:
        # A concurrent attempt of the same slot may have put back its own; one of the two is fenced.
        displaced, _ = _slots.get(key, (None, 0.0))
        _slots[key] = (slot, time.monotonic())
    if displaced is not None:
        displaced.close()


def close_idle_slots() -> None:
    now = time.monotonic()
    with _slots_lock:
        idle = [key for key, (_, used) in _slots.items() if now - used > IDLE_SLOT_TIMEOUT_S]
        closing = [_slots.pop(key)[0] for key in idle]
    for slot in closing:
        slot.close()


def agree_to_commit(task: Connection, count: int) -> None:
    task.send((OK, count))
    if task.recv() != COMMIT:
        raise RuntimeError("the write task did not ask for its commit")


def portable(error: BaseException) -> BaseException:
    """`error`, or its text if it cannot cross to the task (confluent-kafka's cannot be pickled)."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
