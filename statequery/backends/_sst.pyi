"""Types of the compiled RocksDB table module (``_sst.pyx``; the pure-Python twin is
:mod:`statequery.backends.sst`)."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any

def block_tuples(
    data: bytes,
    pos: int,
    limit: int,
    start: bytes | None,
    stop: bytes | None,
    global_seqno: int | None,
    source: str,
    base: int,
    match: bytes | None = None,
    match_at: int = 0,
) -> tuple[list[tuple[bytes, int, int, bytes]], bool]: ...

class MergedPairs(Iterator[tuple[bytes, bytes]]):
    def __init__(
        self, sources: Iterable[Iterable[list[tuple[bytes, int, int, bytes]]]],
        delimiter: bytes = b",",
    ) -> None: ...
    def __iter__(self) -> MergedPairs: ...
    def __next__(self) -> tuple[bytes, bytes]: ...

class CheckedPairs(Iterator[Any]):
    def __init__(self, pairs: Iterable[Any], on_end: Callable[[Any], None]) -> None: ...
    def __iter__(self) -> CheckedPairs: ...
    def __next__(self) -> Any: ...

class TableScan:
    def __init__(
        self,
        tables: list[tuple[Any, ...]],
        start: bytes | None,
        stop: bytes | None,
        prefix_len: int,
        delimiter: bytes = b",",
        chunk_bytes: int = 1 << 20,
    ) -> None: ...
    def next_chunk(self) -> tuple[int, int, bytes, bool]: ...
    def next_view(self) -> tuple[int, int, memoryview, bool]: ...

def unpack_chunk(buf: bytes) -> list[tuple[bytes, bytes]]: ...
