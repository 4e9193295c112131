"""One request frame per kind of malformation, each made from a valid request by a small change."""

from __future__ import annotations

import datetime

from onceflow.protocol.codec import request_type
from tests.protocol.entities import encode


def malformed_frames() -> dict[str, bytes]:
    # OffsetCommit v2 with `topics` (not nullable) sent as null: a handler would iterate None.
    commit = encode(
        request_type(8, 2)(
            group_id="g",
            generation_id_or_member_epoch=1,
            member_id="m",
            retention_time=datetime.timedelta(0),
            topics=(),
        )
    )
    assert commit.endswith(b"\x00\x00\x00\x00")  # the empty legacy array
    metadata = encode(request_type(3, 4)(topics=(), allow_auto_topic_creation=False))
    topics_at = len(metadata) - 5  # the topics count, then the auto-creation flag
    after_topics = metadata[topics_at + 4 :]
    api_versions = encode(request_type(18, 3)(client_software_name="a", client_software_version="1"))
    return {
        "null-non-nullable-array": commit[:-4] + b"\xff\xff\xff\xff",
        "negative-count": metadata[:topics_at] + b"\xff\xff\xff\xfe" + after_topics,
        # One topic whose name claims 64 bytes, with one left.
        "nested-length-past-frame": metadata[:topics_at]
        + b"\x00\x00\x00\x01\x00\x40t"
        + metadata[topics_at + 4 :],
        # Tag 7 is not ApiVersions v3's: kio's reader refuses it, where Kafka would skip it.
        "unknown-tagged-field": api_versions[:-1] + bytes([1, 7, 3, 1, 2, 3]),
    }
