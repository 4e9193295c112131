"""Brokers that form a cluster through ZooKeeper, after Kafka's ZooKeeper-era controller.

`znodes` names the znodes and their JSON, `controller` is the controller's state machine (pure:
events in, partition-state writes out), `view` is what a broker knows of the cluster, `status`
what an operator is shown of it, and `zk` is the thin kazoo shell that runs them
(docs/architecture.md, Cluster mode).
"""
