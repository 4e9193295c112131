"""DescribeLogDirs (35): the broker's one data directory with each partition's size.

`offset_lag` is Kafka's: how far the log end is behind the high watermark, max(high watermark -
log end offset, 0), which is always 0 for a leader and a follower's lag behind what its leader
says is committed (there are no future replicas here).
Topics and partitions asked for that do not exist are left out, as Kafka does; null asks for
every partition. v4 reports the file system's total and usable bytes.
"""

from __future__ import annotations

import shutil
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 35
MIN_VERSION = 1
MAX_VERSION = 4


def handle(request: Request) -> Any:
    broker = request.broker
    wanted = request.body.topics
    selected: dict[str, list[int]] = {}
    for topic, partition, _ in broker.logs.partitions():
        if wanted is None or any(w.topic == topic and partition in w.partitions for w in wanted):
            selected.setdefault(topic, []).append(partition)
    topics = []
    for topic, partitions in sorted(selected.items()):
        described = []
        for partition in sorted(partitions):
            log = broker.logs.get(topic, partition)
            if log is None:  # deleted meanwhile
                continue
            described.append(
                {
                    "partition_index": partition,
                    "partition_size": log.size_bytes,
                    "offset_lag": max(broker.high_watermark(topic, partition, log) - log.log_end_offset, 0),
                    "is_future_key": False,
                }
            )
        topics.append({"name": topic, "partitions": described})
    data_dir = broker.data_dir.resolve()
    usage = shutil.disk_usage(data_dir)
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        results=[
            {
                "error_code": ErrorCode.none,
                "log_dir": str(data_dir),
                "topics": topics,
                "total_bytes": usage.total,
                "usable_bytes": usage.free,
            }
        ],
    )
