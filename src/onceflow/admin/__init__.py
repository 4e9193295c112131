"""Operators' tools: `onceflow topics`, `onceflow groups` and `onceflow txn`.

This package is a client. It speaks only standard Kafka APIs, through
confluent-kafka's AdminClient where that has the call and through a small kio
wire client (`client.py`) for the transaction APIs it lacks, so every command
works against Apache Kafka as well as against onceflow.
"""
