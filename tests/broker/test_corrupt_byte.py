"""One corrupt byte costs the batch it is in, never acknowledged data around it: a broker stopped
cleanly or killed, a byte flipped in the oldest, a middle and the newest segment, and a restart
that serves every other acknowledged record; `onceflow log check`'s scan lists what does not read."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from kio.schema.errors import ErrorCode

from onceflow.log.batch import CorruptRecordError, decode_records, validate_batches
from onceflow.log.check import SegmentsChecked, check_data_dir
from tests.conftest import BrokerProcess
from tests.wire import WireClient

TOPIC = "acknowledged"
RECORDS = 1000
MAGIC_AT = 16


def _produce(broker: BrokerProcess) -> dict[int, bytes]:
    """RECORDS acknowledged records, by the offset the broker answered with (the client's word)."""
    acknowledged: dict[int, bytes] = {}

    def delivered(error: KafkaError | None, message: object) -> None:
        assert error is None, error
        acknowledged[message.offset()] = message.value()  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.size": 3000,  # batches of a few records, segments of a few batches
        }
    )
    for number in range(RECORDS):
        producer.produce(TOPIC, value=b"%06d-" % number + b"x" * 150, on_delivery=delivered)
        if number % 50 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return acknowledged


def _batches(segment: Path) -> list[tuple[int, range]]:
    """(position, offsets) of each batch of a segment file."""
    found, position = [], 0
    for header in validate_batches(segment.read_bytes()):
        found.append((position, range(header.base_offset, header.last_offset + 1)))
        position += header.size
    return found


def _flip(segment: Path, position: int) -> None:
    data = bytearray(segment.read_bytes())
    data[position] ^= 0xFF
    segment.write_bytes(data)


def _read_everything(broker: BrokerProcess) -> tuple[dict[int, bytes], list[int]]:
    """Every record a consumer can read, CRC-checked as clients check it, and the offsets that
    answer CORRUPT_MESSAGE or come in a batch whose CRC fails."""
    read: dict[int, bytes] = {}
    unreadable: list[int] = []
    offset = 0
    with WireClient(broker.bootstrap_servers) as wire:
        end = wire.list_offset(TOPIC, 0)
        while offset < end:
            answer = wire.fetch({TOPIC: [0]}, fetch_offset=offset).responses[0].partitions[0]
            if answer.error_code == ErrorCode.corrupt_message:
                unreadable.append(offset)
                offset += 1
                continue
            assert answer.error_code == ErrorCode.none, answer.error_code
            position, data = 0, answer.records or b""
            assert data, f"nothing at {offset} below the end {end}"
            while position < len(data):
                try:
                    (header,) = validate_batches(data[position : position + _size(data, position)])
                except (CorruptRecordError, ValueError):
                    header = None
                if header is None:  # a batch whose bytes changed: the client's CRC check
                    if position == 0:
                        unreadable.append(offset)  # the one being read lies in it
                        offset += 1
                    break
                batch = data[position : position + header.size]
                read.update((record.offset, record.value or b"") for record in decode_records(batch))
                position += header.size
                offset = header.last_offset + 1
    return read, unreadable


def _size(data: bytes, position: int) -> int:
    return 12 + int.from_bytes(data[position + 8 : position + 12], "big")


@pytest.mark.parametrize("stop", ["clean", "kill"])
def test_a_corrupt_byte_loses_no_acknowledged_record_around_it(tmp_path: Path, stop: str) -> None:
    broker = BrokerProcess(tmp_path / "data", settings={"log.segment.bytes": "10240"}).start()
    try:
        with WireClient(broker.bootstrap_servers) as wire:
            assert wire.create_topic(TOPIC, 1) == ErrorCode.none
        acknowledged = _produce(broker)
        broker.terminate() if stop == "clean" else broker.kill()
        segments = sorted((tmp_path / "data" / f"{TOPIC}-0").glob("*.log"))
        assert len(segments) >= 17
        # The oldest segment's last batch loses its magic byte (the finding); a middle one a
        # byte of its records (its CRC fails); the newest one a byte of its first batch.
        position, oldest = _batches(segments[0])[-1]
        _flip(segments[0], position + MAGIC_AT)
        (_, middle), (after, _) = _batches(segments[8])[1:3]
        _flip(segments[8], after - 3)
        position, newest = _batches(segments[-1])[0]
        _flip(segments[-1], position + 70)
        broker.start()
        read, unreadable = _read_everything(broker)
    finally:
        broker.terminate()
    damaged = (oldest, middle, newest)
    lost = {offset for offset, value in acknowledged.items() if read.get(offset) != value}
    assert lost <= {offset for batch in damaged for offset in batch}  # nothing around them
    assert all(batch.start in unreadable for batch in damaged)  # each reported, not skipped
    assert len(acknowledged) == RECORDS
    findings = list(check_data_dir(tmp_path / "data", SegmentsChecked()))
    assert sorted(finding.corrupt.first_offset for finding in findings) == [batch.start for batch in damaged]
