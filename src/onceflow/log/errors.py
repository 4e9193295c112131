"""Errors raised by the storage layer, each carrying the Kafka error code to answer with."""

from __future__ import annotations

from typing import ClassVar

from kio.schema.errors import ErrorCode


class LogError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


class LogAppendError(LogError):
    """The append was refused and nothing was written."""


class LogReadError(LogError):
    pass


class LogDirectoryFailure(LogAppendError):
    """A write failed and could not be taken back: the log's files and memory may disagree, so
    the log directory goes offline (a broker with one directory halts, as Kafka's does)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.kafka_storage_error, message)


class ProducerStateError(LogError):
    """An idempotent batch broke the epoch or sequence rules."""


class _FixedCodeError(LogError):
    code: ClassVar[ErrorCode]

    def __init__(self, message: str) -> None:
        super().__init__(self.code, message)


class TopicExistsError(_FixedCodeError):
    code = ErrorCode.topic_already_exists


class InvalidTopicError(_FixedCodeError):
    code = ErrorCode.invalid_topic_exception


class InvalidPartitionsError(_FixedCodeError):
    code = ErrorCode.invalid_partitions


class PolicyViolationError(_FixedCodeError):
    code = ErrorCode.policy_violation


class InvalidConfigError(_FixedCodeError):
    code = ErrorCode.invalid_config


class UnknownTopicError(_FixedCodeError):
    code = ErrorCode.unknown_topic_or_partition


class DataDirLockedError(_FixedCodeError):
    """Another process (or another LogManager) already owns the data directory."""

    code = ErrorCode.kafka_storage_error


class LogLoadError(Exception):
    """A log or a file about the logs cannot be read without guessing, or opened without deleting
    data it must keep: start-up stops with this one line, which names the file."""
