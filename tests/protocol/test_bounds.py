"""The bounds check agrees with kio on every request it can write, and refuses what does not fit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.protocol.bounds import FrameBoundsError, check_frame, int_fields, walk_frame
from onceflow.protocol.codec import MalformedRequestError, decode_request
from tests.protocol.entities import encode, entities, supported_request_types
from tests.protocol.malformed import malformed_frames

REQUEST_TYPES = supported_request_types()
# The frames of issue 15: each made kio's native reader abort the whole broker process.
KILLER_FRAMES = [
    bytes.fromhex(
        "000800080000002b000772646b61666b610005667a2d67000000012d72646b61666b612d37373737383638322d61"
        "3064652d343239372d613062322d62373434653663393562323700ffffffff2d3066396161020000000000000000"
        "000000050000000001000000"
    ),
    bytes.fromhex(
        "000900080000000700136b61666b612d707974686f6e2d332e302e313200ffffffff2d6b670209667a2d30663961"
        "6103000000000000000100000000"
    ),
    bytes.fromhex(
        "000b00070000000300136b61666b612d707974686f6e2d332e302e31320006667a2d6b670000afc8000493e0396b"
        "61666b612d707974686f6e2d332e302e31322d64376533373332662d323333632d343962652d383037642d353039"
        "3437333866393361320009636f6e73756d6572ffffffff6e6765150000000000010008667a2d3066396161000000"
        "00000b726f756e64726f62696e150000000000010008667a2d3066396161000000000000"
    ),
]


def _walk(frame: bytes, body_class: type[Any]) -> int:
    return walk_frame(frame, body_class.__header_schema__, body_class, None)


@pytest.mark.parametrize("body_class", REQUEST_TYPES, ids=lambda c: f"{c.__name__}-v{c.__version__}")
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_every_written_request_passes_and_is_walked_to_its_end(body_class: type[Any], data: Any) -> None:
    frame = encode(data.draw(entities(body_class)))
    assert _walk(frame, body_class) == len(frame)
    assert decode_request(frame)[1].__class__ is body_class


@pytest.mark.parametrize("body_class", REQUEST_TYPES[::7], ids=lambda c: f"{c.__name__}-v{c.__version__}")
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_every_truncation_is_refused(body_class: type[Any], data: Any) -> None:
    frame = encode(data.draw(entities(body_class)))
    cut = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    with pytest.raises(FrameBoundsError):
        check_frame(frame[:cut], body_class.__header_schema__, body_class)


@pytest.mark.parametrize("frame", KILLER_FRAMES, ids=["OffsetCommit-v8", "OffsetFetch-v8", "JoinGroup-v7"])
def test_the_frames_that_killed_the_broker_are_refused_before_decoding(frame: bytes) -> None:
    with pytest.raises(MalformedRequestError, match="does not fit its frame"):
        decode_request(frame)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("null-non-nullable-array", "array length -1"),
        ("negative-count", "array length -2"),
        ("nested-length-past-frame", "64 bytes needed"),
        ("unknown-tagged-field", "Unknown tagged field"),
    ],
)
def test_each_malformation_is_refused_with_what_is_wrong(kind: str, error: str) -> None:
    with pytest.raises(MalformedRequestError, match=error):
        decode_request(malformed_frames()[kind])


def test_int_fields_names_every_fixed_width_integer_of_the_frame() -> None:
    body_class = next(c for c in REQUEST_TYPES if c.__api_key__ == 2 and c.__version__ == 1)
    frame = encode(_list_offsets_v1(body_class))
    found = int_fields(frame, body_class.__header_schema__, body_class)
    widths = [(field.width, field.is_length) for field in found]
    # Header: api key, version, correlation id, client id length; body: replica id, topics count,
    # name length, partitions count, partition index, timestamp.
    assert widths == [
        (2, False),
        (2, False),
        (4, False),
        (2, True),
        (4, False),
        (4, True),
        (2, True),
        (4, True),
        (4, False),
        (8, False),
    ]


def _list_offsets_v1(body_class: type[Any]) -> Any:
    topic_class = body_class.__dataclass_fields__["topics"].type.__args__[0]
    partition_class = topic_class.__dataclass_fields__["partitions"].type.__args__[0]
    partition = partition_class(partition_index=0, timestamp=-1)
    return body_class(replica_id=-1, topics=(topic_class(name="t", partitions=(partition,)),))
