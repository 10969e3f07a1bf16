"""Types of the compiled decode module (``_read.pyx``; the pure-Python twin is
:mod:`statequery.backends.keygroups`, the switch :mod:`statequery.backends.fastpath`)."""

from collections.abc import Callable, Container, Iterable, Iterator, Sequence

import pyarrow as pa

K_VALUE: int
K_TIMER: int
K_MAP: int
K_LIST: int
K_LIST_FLAT: int
K_MAP_NESTED: int

T_LONG: int
T_INT: int
T_SHORT: int
T_BYTE: int
T_DOUBLE: int
T_FLOAT: int
T_BOOL: int
T_STRING: int
T_BYTES: int
T_STRING_DATA: int
T_ENUM: int
T_DECIMAL: int
T_TIMESTAMP: int

S_TUPLE: int
S_POJO: int
S_ROW: int
S_ROWDATA: int

class Col:
    """A column being decoded (values appended in C)."""

class Column(Col):
    def __init__(
        self, typ: int, constants: Sequence[str] = (), what: str | None = None, precision: int = 0
    ) -> None: ...

class StructCol(Col):
    def __init__(
        self,
        skind: int,
        children: list[Col],
        what: str = "value",
        mask_offset: int = 0,
        row_kind: bool = False,
        derive: Callable[[list[pa.Array]], list[pa.Array]] | None = None,
    ) -> None: ...

class NullCol(Col):
    def __init__(self, size: int, what: str = "null") -> None: ...

class VarCol(Col):
    def __init__(self, inner: Col) -> None: ...

class ListCol(Col):
    def __init__(self, inner: Col, min_size: int, what: str = "list") -> None: ...

class SqlArrayCol(ListCol): ...

class EntrySink:
    """One state's composite-key entries decoded into column buffers; callable like a
    pure-Python entry handler."""

    def __init__(
        self,
        kind: int,
        key: Col | None,
        value: Col | None,
        user_key: Col | None = None,
        ns: Col | None = None,
        ttl: bool = False,
        skip: bool = False,
        suffixed: bool = False,
    ) -> None: ...
    def finish(self) -> None: ...
    def __len__(self) -> int: ...
    def __call__(
        self, buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int
    ) -> None: ...
    def walk(self, buf: bytes, pos: int, end: int, n: int, kg: int) -> int: ...
    def arrays(self, schema: pa.Schema) -> dict[str, pa.Array]: ...

def scan_key_group(
    buf: bytes,
    kg: int,
    prefix_len: int,
    handlers: Sequence[Callable[..., None] | None],
    finishers: Iterable[Callable[[], None]] = (),
    runs: list[int] | None = None,
) -> int: ...
def feed_key_group(
    sink: EntrySink,
    it: Iterator[tuple[bytes, bytes]],
    prefix_len: int,
    pending: tuple[bytes, bytes] | None,
    stop: bytes,
    wanted: Container[int] | None,
) -> tuple[int, int, tuple[bytes, bytes] | None]: ...
def feed_packed(
    sink: EntrySink, buf: bytes | memoryview, prefix_len: int, finish: bool
) -> int: ...

class KeyFilter:
    """Passes on only the entries whose key starts with one of ``wanted`` (compared in C)."""

    def __init__(
        self, inner: Callable[..., None], wanted: Sequence[bytes], skip: int = 0
    ) -> None: ...
    def __call__(self, buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None: ...
