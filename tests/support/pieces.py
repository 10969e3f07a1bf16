"""Items for :func:`statequery.parallel.ordered_map` in tests: module-level (workers unpickle
them by name) and tagged with the process that computed them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa


def tagged(item: tuple[int, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Item ``(value, rows)``: ``rows`` rows holding ``value`` and this process's id, in two
    batches (the second empty when ``rows`` is 1)."""
    value, rows = item
    for n in (rows - rows // 2, rows // 2):
        yield "tagged", pa.record_batch(
            [pa.array([value] * n, pa.int64()), pa.array([os.getpid()] * n, pa.int64())],
            names=["value", "pid"],
        )


def failing_at(item: tuple[int, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Like :func:`tagged`, but item value 13 raises after its first batch."""
    from statequery.exceptions import CorruptStateError

    for i, pair in enumerate(tagged(item)):
        if item[0] == 13 and i == 1:
            raise CorruptStateError("item 13 is broken", "item-13", 13)
        yield pair


def failing_in_worker(item: tuple[int, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Item ``(value, caller pid)``: a batch in the calling process, an error in a worker."""
    from statequery.exceptions import CorruptStateError

    value, caller = item
    if os.getpid() != caller:
        raise CorruptStateError(f"item {value} failed in worker: bad bytes", f"item-{value}",
                                value)
    yield from tagged((value, 2))


def dying_in_worker(item: tuple[int, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Item ``(value, caller pid)``: a worker process dies on it (as the kernel's OOM killer
    would end it); the calling process computes it."""
    value, caller = item
    if os.getpid() != caller:
        os._exit(9)
    yield from tagged((value, 3))


def zoo(item: tuple[int, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Item ``(seed, rows)``: batches of every Arrow type a read gives (and a dictionary one,
    which travels as IPC), with nulls, empty values and edge values, cut into slices that share
    their buffers (as a read's batches do), the last slice empty."""
    import datetime
    import decimal

    seed, rows = item
    values = []
    for i in range(rows):
        j = i + seed
        values.append(None if j % 7 == 3 else j)

    def pick(fn):  # noqa: ANN001, ANN202 - None where the row is null
        return [None if v is None else fn(v) for v in values]

    struct_t = pa.struct([("a", pa.int32()), ("s", pa.string()),
                          ("l", pa.list_(pa.int64()))])
    columns = {
        "bool": pa.array(pick(lambda v: v % 3 == 0), pa.bool_()),
        "byte": pa.array(pick(lambda v: (v % 256) - 128), pa.int8()),
        "long": pa.array(pick(lambda v: [-(2**63), 2**63 - 1, 0, v][v % 4]), pa.int64()),
        "double": pa.array(pick(lambda v: [float("nan"), -0.0, float("inf"), v / 3][v % 4]),
                           pa.float64()),
        "string": pa.array(pick(lambda v: ["", "\x00", "\U0001f600", f"k{v}"][v % 4]),
                           pa.string()),
        "large": pa.array(pick(lambda v: f"{v}" * (v % 5)), pa.large_string()),
        "bytes": pa.array(pick(lambda v: b"" if v % 3 == 0 else bytes([v % 256]) * 3),
                          pa.binary()),
        "fixed": pa.array(pick(lambda v: bytes([v % 256]) * 4), pa.binary(4)),
        "decimal": pa.array(pick(lambda v: decimal.Decimal(v) / 100), pa.decimal128(20, 2)),
        "ts": pa.array(pick(lambda v: -86_400_000 * v), pa.timestamp("ms", tz="UTC")),
        "date": pa.array(pick(lambda v: datetime.date(1969, 12, 31) - datetime.timedelta(v)),
                         pa.date32()),
        "null": pa.nulls(rows),
        "list": pa.array(pick(lambda v: [f"e{k}" for k in range(v % 4)]), pa.list_(pa.string())),
        "map": pa.array(pick(lambda v: [(f"m{k}", None if k == 1 else k) for k in range(v % 3)]),
                        pa.map_(pa.string(), pa.int64())),
        "struct": pa.array(pick(lambda v: {"a": v, "s": None if v % 2 else str(v),
                                            "l": [v] * (v % 3)}), struct_t),
        "list_of_struct": pa.array(pick(lambda v: [{"a": v, "s": "x", "l": []}] * (v % 2)),
                                   pa.list_(struct_t)),
    }
    whole = pa.record_batch(list(columns.values()), names=list(columns))
    third = max(1, rows // 3)
    for start in range(0, rows, third):
        yield "zoo", whole.slice(start, third)
    yield "zoo", whole.slice(rows, 0)
    dictionary = pa.array(pick(lambda v: f"d{v % 5}"), pa.string()).dictionary_encode()
    yield "dict", pa.record_batch([dictionary], names=["d"]).slice(1)


def decoded_piece(item: tuple[str, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Item ``(savepoint path, key group)``: that key group of every keyed state, read with
    the compiled path (its buffers built into the arena when one is set)."""
    import statequery

    path, key_group = item
    sp = statequery.open(path, use_snapshot=False)
    for op in sp.keyed_operators():
        for state in op.states:
            if state.keyed_rows:
                for batch in sp.read_batches(op, state.name, key_groups=[key_group],
                                             workers=1):
                    yield state.name, batch


_kept: list[pa.RecordBatch] = []


def keeping(item: tuple[str, int]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Like :func:`decoded_piece`, but the first batch is kept in this process after the item
    (as a cache would keep one)."""
    for name, batch in decoded_piece(item):
        if not _kept:
            _kept.append(batch)
        yield name, batch
