"""Storage layer: partition logs on disk (segments, indexes, producer state), no networking."""

from onceflow.log.batch import (
    BatchHeader,
    CorruptRecordError,
    parse_batch_header,
    patch_base_offset,
    validate_batches,
)
from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    DataDirLockedError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogAppendError,
    LogError,
    LogReadError,
    ProducerStateError,
    TopicExistsError,
    UnknownTopicError,
)
from onceflow.log.log import AppendResult, PartitionLog
from onceflow.log.manager import LogManager, TopicInfo
from onceflow.log.producer_state import DuplicateBatch, ProducerStateManager

__all__ = [
    "AppendResult",
    "BatchHeader",
    "CorruptRecordError",
    "DataDirLockedError",
    "DuplicateBatch",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "LogAppendError",
    "LogConfig",
    "LogError",
    "LogManager",
    "LogReadError",
    "PartitionLog",
    "ProducerStateError",
    "ProducerStateManager",
    "TopicExistsError",
    "TopicInfo",
    "UnknownTopicError",
    "parse_batch_header",
    "patch_base_offset",
    "validate_batches",
]
