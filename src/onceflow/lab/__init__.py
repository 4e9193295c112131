"""The delivery-semantics lab: real clients, real faults, and a checker after Jepsen's Kafka workload."""
