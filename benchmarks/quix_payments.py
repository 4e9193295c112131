"""quixstreams side of the `spark` benchmark: the Spark query's transform, exactly-once, one process.

    .venv-quixstreams/bin/python quix_payments.py --bootstrap HOST:PORT --topic T --output-topic O
        --partitions 4 --records N --consumer-group G --state-dir DIR

Runs in the venv of its own that `quixstreams_venv.py` makes (quixstreams pins confluent-kafka
below the project's), so it imports quixstreams and the standard library only. Reads the topic
from the earliest offsets with `processing_guarantee="exactly-once"` (a read_committed consumer,
and one producer transaction per checkpoint that also commits the consumer's offsets), writes
every record to the output topic, stops after `--records` outputs, and prints its figures as one
JSON line: records/s from the first record to the end of the final checkpoint's commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from quixstreams import Application
from quixstreams.models.topics import TopicConfig

_IDLE_TIMEOUT_S = 60.0


def transform(value: bytes) -> bytes:
    """The Spark query's `upper(value) || "!"` (spark_job.py; onceflow is not in this venv).

    bytes.upper() changes ASCII letters only, where Spark upper-cases the value decoded as UTF-8,
    so on random payloads the bytes may differ; the work per record (one copy, one output record
    with the same key) is the same.
    """
    return value.upper() + b"!"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--consumer-group", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.consumer_group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    source = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(
        args.output_topic,
        key_serializer="bytes",
        value_serializer="bytes",
        config=TopicConfig(num_partitions=args.partitions, replication_factor=1),
    )
    first_record_at = 0.0
    processed = 0

    def count(value: bytes) -> None:
        nonlocal first_record_at, processed
        if not processed:
            first_record_at = time.perf_counter()
        processed += 1

    frame = app.dataframe(source).update(count).apply(transform)
    frame.to_topic(sink)
    # run() returns after the last record's output, the final checkpoint commit (the transaction
    # with the consumer's offsets) and the clients' close; or once no record came for the idle
    # timeout, so a short input fails here rather than waiting for the benchmark's timeout.
    app.run(count=args.records, timeout=_IDLE_TIMEOUT_S)
    finished_at = time.perf_counter()
    if processed != args.records:
        raise SystemExit(f"quixstreams processed {processed} records, expected {args.records}")
    seconds = finished_at - first_record_at
    print(json.dumps({"records": args.records, "seconds": seconds, "records_per_s": args.records / seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
