"""Real faults for tests and the lab: a loopback TCP proxy that loses acks."""
