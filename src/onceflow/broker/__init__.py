"""Broker runtime: configuration, logs, producer ids, durability and wake-ups."""
