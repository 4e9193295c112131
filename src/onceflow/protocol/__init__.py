"""Sans-I/O Kafka protocol core: bytes in, events out (after h11).

Nothing in this package touches sockets, files or an event loop.
"""
