"""What the network shell admits, as pure bookkeeping (after Kafka's `ConnectionQuotas` and
`MemoryPool`): how many connections, from one address and in all, and how many bytes of request
frames are held at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

__all__ = ["ConnectionQuotas", "MemoryPool"]


class MemoryPool:
    """Bytes of large request frames held at once (Kafka's `queued.max.request.bytes`): a
    connection whose next frame does not fit waits, unread, until another frame is done."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # <= 0: unbounded, as Kafka's -1
        self.used = 0
        self._waiting: list[Callable[[], None]] = []

    def try_reserve(self, size: int) -> bool:
        # A frame larger than the whole pool still gets it when nothing else is held, or no
        # request of socket.request.max.bytes could ever be read.
        if self.capacity > 0 and self.used and self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size
        waiting, self._waiting = self._waiting, []
        for wake in waiting:
            wake()

    def when_released(self, wake: Callable[[], None]) -> None:
        """Call `wake` once the next reservation is released."""
        self._waiting.append(wake)


class ConnectionQuotas:
    """Kafka's `max.connections` and `max.connections.per.ip`; `room()` says how many more the
    process can take at all (its open-file headroom), so that clients never take the descriptors
    the logs need."""

    def __init__(self, max_connections: int, max_per_ip: int, room: Callable[[], int]) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self._room = room
        self._by_ip: Counter[str] = Counter()
        self.total = 0

    def admit(self, ip: str) -> str | None:
        """Count a new connection from `ip`, or say why it is refused."""
        if self._by_ip[ip] >= self.max_per_ip:
            return f"{ip} has {self._by_ip[ip]} connections (max.connections.per.ip)"
        if self.total >= self.max_connections:
            return f"the broker has {self.total} connections (max.connections)"
        if self._room() <= 0:
            return f"the broker has {self.total} connections and no file descriptor to spare"
        self._by_ip[ip] += 1
        self.total += 1
        return None

    def release(self, ip: str) -> None:
        self._by_ip[ip] -= 1
        if not self._by_ip[ip]:
            del self._by_ip[ip]
        self.total -= 1
