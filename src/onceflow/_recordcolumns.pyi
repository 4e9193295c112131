from typing import Any

class Columns:
    rows: int
    size: int
    def add(
        self,
        records: bytes | bytearray | memoryview,
        count: int,
        base_offset: int,
        base_timestamp: int,
        log_append_time: bool,
        max_timestamp: int,
        first: int,
        end: int,
    ) -> int: ...
    def take(self) -> tuple[Any, ...]: ...
