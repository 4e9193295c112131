"""WriteTxnMarkers (27): a transaction coordinator asks a partition's leader for COMMIT or ABORT
markers.

In a cluster the coordinator sends it to every leader of the transaction's partitions
(`broker.txn_markers`). Each partition is answered once the marker is durable and every in-sync
replica has it: NOT_LEADER_OR_FOLLOWER from a broker that does not lead it, REQUEST_TIMED_OUT
if the ISR did not copy it in time; the coordinator asks again. As on a Kafka broker without an
authorizer, any client may send it.
"""

from __future__ import annotations

from typing import Any

from onceflow.apis.common import Request
from onceflow.broker.core import now_ms
from onceflow.broker.txn_markers import write_as_leader

API_KEY = 27
MIN_VERSION = 1  # Kafka 4 removed v0
MAX_VERSION = 1


async def _answer(request: Request) -> Any:
    results = []
    for marker in request.body.markers:
        partitions = [(topic.name, index) for topic in marker.topics for index in topic.partition_indexes]
        written = await write_as_leader(
            request.broker,
            marker.producer_id,
            marker.producer_epoch,
            marker.transaction_result,
            marker.coordinator_epoch,
            partitions,
            now_ms(),
        )
        results.append(
            {
                "producer_id": marker.producer_id,
                "topics": [
                    {
                        "name": topic.name,
                        "partitions": [
                            {"partition_index": index, "error_code": written[(topic.name, index)]}
                            for index in topic.partition_indexes
                        ],
                    }
                    for topic in marker.topics
                ],
            }
        )
    return request.respond(markers=results)


def handle(request: Request) -> Any:
    return _answer(request)
