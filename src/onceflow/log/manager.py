"""The broker's data directory: topics, their partition logs and the recovery checkpoint.

Layout (Kafka's naming):
    data_dir/.lock                              flock held while a broker owns the directory; it
                                                holds the machine's boot id (a crash or a reboot?)
    data_dir/.kafka_cleanshutdown               the last owner stopped cleanly: nothing to recover
    data_dir/topics.json                        topic name -> id, partition count, configs
    data_dir/recovery-point-offset-checkpoint   per partition, the offset below which all is fsynced
    data_dir/<topic>-<partition>/               one PartitionLog each (with its log-start-offset
                                                when DeleteRecords moved it)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import resource
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    DataDirLockedError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogError,
    LogLoadError,
    PolicyViolationError,
    TopicExistsError,
    UnknownTopicError,
)
from onceflow.log.files import fsync_directory, write_atomically
from onceflow.log.loader import Shutdown
from onceflow.log.log import PartitionLog
from onceflow.log.topic_configs import validate_topic_configs

_log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"
RECOVERY_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
# Kafka's name: written last by a clean shutdown, removed first by the next start.
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
LOCK_FILE = ".lock"
MAX_TOPIC_NAME_LENGTH = 249
MAX_NEW_PARTITIONS_PER_REQUEST = 10_000
# A segment keeps its .log, .index and .timeindex open; a quarter of the open-file limit, up to
# 1024, is kept for sockets and everything else.
FILES_PER_SEGMENT = 3
MAX_FILES_RESERVED = 1024
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_PARTITION_DIR = re.compile(r"[a-zA-Z0-9._-]+-\d+")
# A directory being removed is renamed first, so a crash mid-removal leaves it recognisable.
_DELETE_SUFFIX = "-delete"
_STRAY_SUFFIX = "-stray"
_CHECKPOINT_VERSION = 0


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str]


@dataclass
class NewPartitions:
    """Partitions planned, made on disk by `LogManager.make`, not yet part of the broker."""

    info: TopicInfo  # the topic once they are added
    partitions: range
    config: LogConfig
    logs: list[PartitionLog] = dataclasses.field(default_factory=list)


class LogManager:
    def __init__(self, data_dir: Path, broker_config: LogConfig, now_ms: int) -> None:
        """Take the directory lock, then open every partition with recovery."""
        self.data_dir = data_dir
        self.broker_config = broker_config
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_data_dir(data_dir)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._checkpoint_lock = threading.Lock()
        self._last_checkpoint: dict[tuple[str, int], int] | None = None
        self._closed = False
        self._making: set[str] = set()  # topics whose new partitions are being made on disk
        # Called (from any thread) when a log goes offline: its files and memory may disagree.
        self.on_failure: Callable[[str], None] = _log.critical
        # Counts the changes to the topics (created, deleted, grown, reconfigured), so that a
        # view of them is made again only when they changed.
        self.changes = 0
        try:
            self.topics = _read_topics(data_dir / TOPICS_FILE)
            recovery_points = _read_checkpoint(data_dir / RECOVERY_CHECKPOINT_FILE)
            self.shutdown = self._take_over(data_dir)
            self.names_by_topic_id = {info.topic_id: name for name, info in self.topics.items()}
            self._set_aside_unknown_dirs()
            for info in self.topics.values():
                config = self.topic_config(info.name)
                for partition in range(info.partitions):
                    self._adopt(
                        info.name,
                        partition,
                        PartitionLog.open(
                            self._partition_dir(info.name, partition),
                            config,
                            recovery_points.get((info.name, partition), 0),
                            now_ms,
                            self.shutdown,
                        ),
                    )
        except BaseException:
            for log in self._logs.values():
                log.close(flush=False)
            os.close(self._lock_fd)
            raise

    def _take_over(self, data_dir: Path) -> Shutdown:
        """How the last owner stopped (a clean-shutdown marker, or the machine's boot id it
        left in the lock file), before this broker writes anything: the marker goes, durably,
        so that a crash from now on is never taken for a clean stop."""
        marker = data_dir / CLEAN_SHUTDOWN_FILE
        previous_boot = os.pread(self._lock_fd, 64, 0).decode(errors="replace").strip()
        if marker.exists():
            shutdown = Shutdown.CLEAN
            marker.unlink()
            fsync_directory(data_dir)
        elif previous_boot and previous_boot == _boot_id():
            shutdown = Shutdown.CRASH
        else:
            shutdown = Shutdown.REBOOT
        self._write_lock_file(_boot_id())
        if shutdown is not Shutdown.CLEAN and self._has_logs():
            _log.warning("%s was not shut down cleanly (%s): recovering", data_dir, shutdown.value)
        return shutdown

    def _has_logs(self) -> bool:
        return (self.data_dir / TOPICS_FILE).exists()

    def _write_lock_file(self, content: str) -> None:
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, content.encode(), 0)

    def _adopt(self, topic: str, partition: int, log: PartitionLog) -> None:
        log.on_failure = self._log_failed
        self._logs[topic, partition] = log

    def _log_failed(self, reason: str) -> None:
        self.mark_failed()
        self.on_failure(reason)

    def mark_failed(self) -> None:
        """The directory failed (a failed fsync or write): the next start must not take the page
        cache's word for what is on disk, so it recovers as after a reboot."""
        with contextlib.suppress(OSError):
            self._write_lock_file("")

    # -- topics -------------------------------------------------------------------------------

    def validate_new_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> LogConfig:
        """Raise what `create_topic` would raise; return the topic's effective config."""
        validate_topic_name(name)
        if name in self.topics or name in self._making:
            raise TopicExistsError(f"topic '{name}' already exists")
        collision = topic_collision(name, self.topics)
        if collision is not None:
            raise InvalidTopicError(collision)
        if partitions < 1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, got {partitions}")
        _check_partitions_per_request(partitions)
        self._check_open_files(partitions)
        validate_topic_configs(configs)
        return self._overlay(configs)

    def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str], topic_id: uuid.UUID | None = None
    ) -> TopicInfo:
        """A new topic; in a cluster, with the id every broker shares."""
        plan = self.plan_topic(name, partitions, configs, topic_id)
        self.make(plan)
        return self.add(plan)

    def plan_topic(
        self, name: str, partitions: int, configs: Mapping[str, str], topic_id: uuid.UUID | None = None
    ) -> NewPartitions:
        """A new topic, checked and its name taken, to be made on disk (`make`, on any thread:
        thousands of partitions take seconds) and then added (`add`), or let go (`drop`)."""
        config = self.validate_new_topic(name, partitions, configs)
        info = TopicInfo(name, topic_id or uuid.uuid4(), partitions, dict(configs))
        self._making.add(name)
        return NewPartitions(info, range(partitions), config)

    def delete_topic(self, name: str) -> None:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic '{name}'")
        del self.topics[name]
        del self.names_by_topic_id[info.topic_id]
        logs = [self._logs.pop((name, partition)) for partition in range(info.partitions)]
        # topics.json is the commit point: after it, the directories are only leftovers.
        self._write_topics()
        for log in logs:
            log.close(flush=False)
            _remove_dir(log.directory)

    def validate_new_partition_count(self, name: str, new_total: int) -> TopicInfo:
        """Raise what `create_partitions` would raise; return the topic as it is now."""
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic '{name}'")
        if name in self._making:
            raise InvalidPartitionsError(f"partitions of '{name}' are being created; ask again")
        if new_total <= info.partitions:
            raise InvalidPartitionsError(
                f"topic '{name}' has {info.partitions} partitions; the count can only grow, "
                f"so {new_total} is not allowed"
            )
        _check_partitions_per_request(new_total - info.partitions)
        self._check_open_files(new_total - info.partitions)
        return info

    def create_partitions(self, name: str, new_total: int) -> None:
        plan = self.plan_partitions(name, new_total)
        self.make(plan)
        self.add(plan)

    def plan_partitions(self, name: str, new_total: int) -> NewPartitions:
        """New partitions of a topic, as `plan_topic`."""
        info = self.validate_new_partition_count(name, new_total)
        self._making.add(name)
        return NewPartitions(
            dataclasses.replace(info, partitions=new_total),
            range(info.partitions, new_total),
            self.topic_config(name),
        )

    def make(self, plan: NewPartitions) -> None:
        """Open every planned partition on disk, or none: a failure removes those already made
        (and lets the plan go). Touches nothing the broker uses, so any thread may run it."""
        try:
            for partition in plan.partitions:
                directory = self._partition_dir(plan.info.name, partition)
                if directory.exists():
                    _set_aside(directory)
                # A new, empty partition has no producers whose expiry depends on the clock.
                plan.logs.append(PartitionLog.open(directory, plan.config, 0, now_ms=0))
        except OSError as error:
            self.drop(plan)
            raise LogError(
                ErrorCode.kafka_storage_error, f"cannot create the partitions of {plan.info.name!r}: {error}"
            ) from error

    def add(self, plan: NewPartitions) -> TopicInfo:
        """The partitions made, now part of the broker; topics.json is the commit point."""
        before = self.topics.get(plan.info.name)
        if plan.partitions.start > 0 and (before is None or before.topic_id != plan.info.topic_id):
            # The topic was deleted while its new partitions were being made.
            self.drop(plan)
            raise UnknownTopicError(f"unknown topic '{plan.info.name}'")
        self.topics[plan.info.name] = plan.info
        try:
            self._write_topics()
        except OSError as error:
            if before is None:
                del self.topics[plan.info.name]
            else:
                self.topics[plan.info.name] = before
            self.drop(plan)
            raise LogError(
                ErrorCode.kafka_storage_error, f"cannot record the partitions of {plan.info.name!r}: {error}"
            ) from error
        self._making.discard(plan.info.name)
        self.names_by_topic_id[plan.info.topic_id] = plan.info.name
        for partition, log in zip(plan.partitions, plan.logs, strict=True):
            self._adopt(plan.info.name, partition, log)
        return plan.info

    def drop(self, plan: NewPartitions) -> None:
        """Let a plan go: what `make` opened is closed and removed (what cannot be removed now is
        set aside at the next start: no topic owns it)."""
        self._making.discard(plan.info.name)
        for log in plan.logs:
            log.close(flush=False)
        with contextlib.suppress(OSError):
            for partition in plan.partitions[: len(plan.logs) + 1]:
                if self._partition_dir(plan.info.name, partition).exists():
                    _remove_dir(self._partition_dir(plan.info.name, partition))
        plan.logs.clear()

    def alter_topic_configs(self, name: str, configs: Mapping[str, str], validate_only: bool = False) -> None:
        """Replace the topic's own configs (AlterConfigs): checked as at creation, written to
        topics.json, then applied to its live partitions. With `validate_only`, only checked."""
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic '{name}'")
        config = self.check_topic_configs(configs)
        if validate_only:
            return
        self.topics[name] = dataclasses.replace(info, configs=dict(configs))
        try:
            self._write_topics()
        except OSError as error:
            self.topics[name] = info
            raise LogError(
                ErrorCode.kafka_storage_error, f"cannot store the configs of {name!r}: {error}"
            ) from error
        for partition in range(info.partitions):
            self._logs[name, partition].config = config

    def check_topic_configs(self, configs: Mapping[str, str]) -> LogConfig:
        """The topic configs `configs` make, over the broker's defaults; InvalidConfigError
        as CreateTopics and AlterConfigs answer."""
        validate_topic_configs(configs)
        return self._overlay(configs)

    def topic_config(self, name: str) -> LogConfig:
        """Broker defaults overlaid with the topic's own configs."""
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic '{name}'")
        return self._overlay(info.configs)

    def _overlay(self, configs: Mapping[str, str]) -> LogConfig:
        try:
            return LogConfig.from_kafka(configs, self.broker_config)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None

    def open_files(self) -> int:
        """The descriptors the logs hold, about: three per segment."""
        return FILES_PER_SEGMENT * sum(log.segment_count for log in self._logs.values())

    def _check_open_files(self, new_partitions: int) -> None:
        """Refuse partitions the open-file limit cannot hold: running out of descriptors would
        fail appends, fsyncs and new connections for every client, where Kafka halts."""
        limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if limit == resource.RLIM_INFINITY:
            return
        reserved = min(MAX_FILES_RESERVED, limit // 4)
        open_segments = sum(log.segment_count for log in self._logs.values())
        if (open_segments + new_partitions) * FILES_PER_SEGMENT + reserved > limit:
            room = max((limit - reserved) // FILES_PER_SEGMENT - open_segments, 0)
            raise PolicyViolationError(
                f"{new_partitions} new partitions do not fit the broker's open-file limit of {limit} "
                f"({open_segments} segments open, room for {room} more partitions); raise `ulimit -n`"
            )

    def _partition_dir(self, name: str, partition: int) -> Path:
        return self.data_dir / f"{name}-{partition}"

    def _write_topics(self) -> None:
        content = {
            info.name: {
                "topic_id": str(info.topic_id),
                "partitions": info.partitions,
                "configs": info.configs,
            }
            for info in self.topics.values()
        }
        data = json.dumps(content, indent=2, sort_keys=True).encode()
        write_atomically(self.data_dir / TOPICS_FILE, data)
        self.changes += 1

    def _set_aside_unknown_dirs(self) -> None:
        """Finish interrupted deletions; keep, but rename, partition directories of topics
        that topics.json does not know, so that a new topic of that name starts empty."""
        expected = {
            f"{info.name}-{partition}"
            for info in self.topics.values()
            for partition in range(info.partitions)
        }
        for child in self.data_dir.iterdir():
            if not child.is_dir():
                continue
            if child.name.endswith(_DELETE_SUFFIX):
                shutil.rmtree(child)
            elif _PARTITION_DIR.fullmatch(child.name) and child.name not in expected:
                _set_aside(child)

    # -- partitions ---------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def partitions(self) -> Iterator[tuple[str, int, PartitionLog]]:
        for (topic, partition), log in list(self._logs.items()):
            yield topic, partition, log

    def apply_retention(self, now_ms: int) -> None:
        for log in list(self._logs.values()):
            log.apply_retention(now_ms)

    def close(self, flush: bool = True) -> None:
        """Close every log; with `flush` (a clean shutdown) fsync them first and record their
        flushed offsets, without it leave what is on disk as it is."""
        if self._closed:
            return
        self._closed = True
        for log in self._logs.values():
            log.close(flush)
        if flush:
            self.write_recovery_checkpoint()
            # Everything is fsynced and checkpointed: the next start checks nothing.
            write_atomically(self.data_dir / CLEAN_SHUTDOWN_FILE, b"")
        os.close(self._lock_fd)

    def write_recovery_checkpoint(self) -> None:
        """Record each partition's flushed offset (skipped when nothing changed). Thread-safe."""
        with self._checkpoint_lock:
            offsets = {key: log.flushed_offset for key, log in list(self._logs.items())}
            if offsets == self._last_checkpoint:
                return
            lines = [str(_CHECKPOINT_VERSION), str(len(offsets))]
            lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()]
            write_atomically(self.data_dir / RECOVERY_CHECKPOINT_FILE, ("\n".join(lines) + "\n").encode())
            self._last_checkpoint = offsets


def topic_collision(name: str, existing: Iterable[str]) -> str | None:
    """Kafka's rule: '.' and '_' collide in metric names, so "a.b" and "a_b" cannot both exist."""
    key = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == key:
            return f"Topic '{name}' collides with existing topic: {other}"
    return None


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1 to 249 characters of [a-zA-Z0-9._-], and not "." or ".."."""
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name '{name}' may only contain ASCII letters, digits, '.', '_' and '-'"
        )


def _lock_data_dir(data_dir: Path) -> int:
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLockedError(
            f"data directory {data_dir} is already in use by another broker ({path} is locked)"
        ) from None
    return fd


def _read_topics(path: Path) -> dict[str, TopicInfo]:
    if not path.exists():
        return {}
    try:
        content = json.loads(path.read_text())
        return {
            name: TopicInfo(
                name, uuid.UUID(entry["topic_id"]), int(entry["partitions"]), dict(entry["configs"])
            )
            for name, entry in content.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # Without it the broker knows no topic, and would set every partition directory aside.
        problem = f"{type(exc).__name__}: {exc}"
        raise LogLoadError(f"{path} is unreadable ({problem}); restore it from a backup") from None


def _read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Recovery points by partition: below one, a partition's data was fsynced and is trusted."""
    try:
        lines = path.read_text().splitlines()
        if int(lines[0]) != _CHECKPOINT_VERSION or int(lines[1]) != len(lines) - 2:
            raise ValueError("unexpected header")
        offsets = {}
        for line in lines[2:]:
            topic, partition, offset = line.split()
            offsets[topic, int(partition)] = int(offset)
        return offsets
    except FileNotFoundError:
        return {}
    except (ValueError, IndexError) as exc:
        # Recovering everything from offset 0 could cut fsynced data after a reboot.
        raise LogLoadError(
            f"{path} is unreadable ({exc}); delete it to check every partition from its start"
        ) from None


def _boot_id() -> str:
    """This boot of the machine: the same after a process crash, another after a restart."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""  # unknown: every crash counts as a reboot


def _renamed(directory: Path, suffix: str) -> Path:
    # Bounded length: a 249-character topic name plus suffixes must stay a valid file name.
    return directory.with_name(f"{directory.name[:200]}.{uuid.uuid4().hex}{suffix}")


def _set_aside(directory: Path) -> None:
    target = _renamed(directory, _STRAY_SUFFIX)
    _log.warning("%s belongs to no known topic; moved to %s", directory, target.name)
    directory.rename(target)


def _remove_dir(directory: Path) -> None:
    target = _renamed(directory, _DELETE_SUFFIX)
    directory.rename(target)
    shutil.rmtree(target)


def _check_partitions_per_request(new_partitions: int) -> None:
    # Kafka's controller caps one request at 10,000 new partitions (POLICY_VIOLATION), so a
    # count of 2^31-1 cannot make the broker create directories until the disk is full.
    if new_partitions > MAX_NEW_PARTITIONS_PER_REQUEST:
        raise PolicyViolationError(
            f"excessively large number of partitions per request: {new_partitions} > "
            f"{MAX_NEW_PARTITIONS_PER_REQUEST}"
        )
