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
