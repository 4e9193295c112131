"""A protocol fuzzer: real clients' requests, mutated, against a real broker process."""
