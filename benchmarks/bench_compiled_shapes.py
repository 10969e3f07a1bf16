"""Compiled decode path against the pure-Python reference, per state shape: prints figures (not
a timed test).

    python benchmarks/bench_compiled_shapes.py [--entries 200000] [--repeat 3]

For each canonical fixture state below (windowed, POJO, tuple, TTL, RowData keys and values,
nested maps),
the state's real entries (as Flink 2.3 wrote them in ``tests/fixtures``) are copied into one
key group of about ``--entries`` entries, which is then decoded into a RecordBatch with the
compiled sink and with the pure-Python handlers: CPU seconds (``time.process_time``, best of
``--repeat``) and entries per CPU-second. The same for state blocks of the hashmap checkpoint
format (native savepoint fixtures), repeated. Then full reads (``Savepoint.read``) of the same
states on the fixtures, as they are (tens of rows: per-read overhead dominates). The load average
is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

STATES = [
    ("datastream-hashmap-canonical", "window-contents", "rows"),
    ("datastream-hashmap-canonical", "_timer_state/event_window-timers", "rows"),
    ("datastream-hashmap-canonical", "profile", "rows"),
    ("datastream-hashmap-canonical", "avg-amount", "rows"),
    ("ttl-kryo-hashmap-canonical", "ttl-count", "rows"),
    ("ttl-kryo-hashmap-canonical", "ttl-list", "rows"),
    ("ttl-kryo-hashmap-canonical", "ttl-list", "flat"),
    ("ttl-kryo-hashmap-canonical", "ttl-map", "rows"),
    ("sql-hashmap-canonical", "distinctAcc_0", "rows"),
    ("sql-hashmap-canonical", "accState", "rows"),
    ("datastream-hashmap-canonical", "amount-by-category", "nested"),
]


def _use(pure: bool) -> None:
    from statequery.backends import fastpath

    if pure:
        os.environ[fastpath.PURE_ENV] = "1"
    else:
        os.environ.pop(fastpath.PURE_ENV, None)


def _find(sp: Any, state: str) -> tuple[Any, Any]:
    from statequery.reader import list_states

    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            if ref.name == state:
                return op, ref
    raise SystemExit(f"no state {state}")


def _entries(sp: Any, op: Any, ref: Any, mode: str) -> tuple[int, int, list[tuple[bytes, bytes]]]:
    """(state id, prefix length, [(composite key after the prefix, value)]) of one state, caught
    from a pure-Python read of the fixture."""
    from statequery.backends import keygroups

    caught: list[tuple[bytes, int, int, int]] = []
    scan = keygroups.scan_key_group

    def spy(buf: bytes, kg: int, prefix_len: int, handlers: Any, finishers: Any = ()) -> int:
        sid = next(i for i, h in enumerate(handlers) if h is not None)
        caught.append((buf, kg, prefix_len, sid))
        return scan(buf, kg, prefix_len, handlers, finishers)

    _use(True)
    saved = keygroups.key_group_scanner
    keygroups.key_group_scanner = lambda: spy  # type: ignore[assignment]
    try:
        sp.read(op, ref.name, mode=mode)
    finally:
        keygroups.key_group_scanner = saved  # type: ignore[assignment]
    out: list[tuple[bytes, bytes]] = []
    sid = prefix_len = 0
    for buf, kg, prefix_len, sid in caught:
        handlers: list[Any] = [None] * 65536

        def record(b: bytes, kpos: int, kend: int, vpos: int, vend: int, _kg: int) -> None:
            out.append((b[kpos:kend], b[vpos:vend]))

        handlers[sid] = record
        scan(buf, kg, prefix_len, handlers)
    return sid, prefix_len, out


def _key_group(sid: int, prefix_len: int, entries: list[tuple[bytes, bytes]], n: int) -> bytes:
    """One canonical key group (number 0) holding ``n`` entries cycled from ``entries``."""
    parts = [struct.pack(">H", sid)]
    prefix = b"\x00" * prefix_len
    for i in range(n):
        key, value = entries[i % len(entries)]
        k = prefix + key
        if i == n - 1:
            k = bytes([k[0] | 0x80]) + k[1:]
        parts.append(struct.pack(">i", len(k)) + k + struct.pack(">i", len(value)) + value)
    parts.append(b"\xff\xff")
    return b"".join(parts)


def _decode(layout: Any, mode: str, buf: bytes, sid: int, prefix_len: int, pure: bool) -> tuple[
        float, int, bool]:
    from statequery.arrow.batches import BatchBuilder
    from statequery.arrow.schemas import state_schema
    from statequery.backends import keygroups
    from statequery.backends.keygroups import CompositeEntryDecoder

    _use(pure)
    builder = BatchBuilder(state_schema(layout, mode), layout)
    decoder = CompositeEntryDecoder(layout, mode, builder)
    handlers: list[Any] = [None] * (sid + 1)
    handlers[sid] = decoder.on_entry
    scan = keygroups.key_group_scanner()
    t = time.process_time()
    scan(buf, 0, prefix_len, handlers, [decoder.finish])
    batch = builder.flush()
    dt = time.process_time() - t
    compiled = builder._sink is not None
    return dt, 0 if batch is None else batch.num_rows, compiled


HEAP_STATES = [
    ("datastream-hashmap-native", "count", "rows"),
    ("datastream-hashmap-native", "recent-categories", "rows"),
    ("datastream-hashmap-native", "amount-by-category", "rows"),
    ("datastream-hashmap-native", "window-contents", "rows"),
    ("datastream-hashmap-native", "profile", "rows"),
    ("datastream-hashmap-native", "_timer_state/event_window-timers", "rows"),
    ("sql-ops-hashmap-native", "accState", "rows"),
    ("sql-ops-hashmap-native", "window-aggs", "rows"),
    ("sql-ops-hashmap-native", "values", "rows"),
    ("sql-ops-hashmap-native", "agg5$orderToValueMap", "rows"),
    ("datastream-hashmap-native", "amount-by-category", "nested"),
]


def _heap_block(sp: Any, op: Any, ref: Any, mode: str) -> tuple[bytes, int] | None:
    """(the entries of one state block, their count) caught from a pure-Python read of a
    hashmap checkpoint / native savepoint fixture; None if the state is not in that format."""
    from statequery.backends import heap

    caught: list[tuple[bytes, int]] = []
    walk = heap.HeapBlockDecoder.walk

    def spy(self: Any, buf: bytes, pos: int, end: int, kg: int) -> int:
        out = walk(self, buf, pos, end, kg)
        if self.layout.name == ref.name and self.builder is not None:
            n = struct.unpack_from(">i", buf, pos)[0]
            if n:
                caught.append((buf[pos + 4 : out], n))
        return out

    _use(True)
    heap.HeapBlockDecoder.walk = spy  # type: ignore[method-assign]
    try:
        sp.read(op, ref.name, mode=mode)
    finally:
        heap.HeapBlockDecoder.walk = walk  # type: ignore[method-assign]
    if not caught:
        return None
    return b"".join(b for b, _ in caught), sum(n for _, n in caught)


def _heap_decode(layout: Any, mode: str, block: bytes, n: int, pure: bool) -> tuple[float, int,
                                                                                    bool]:
    from statequery.arrow.batches import BatchBuilder
    from statequery.arrow.schemas import state_schema
    from statequery.backends.heap import HeapBlockDecoder

    _use(pure)
    builder = BatchBuilder(state_schema(layout, mode), layout)
    decoder = HeapBlockDecoder(layout, builder, mode)
    buf = struct.pack(">i", n) + block
    t = time.process_time()
    decoder.walk(buf, 0, len(buf), 0)
    batch = builder.flush()
    dt = time.process_time() - t
    return dt, 0 if batch is None else batch.num_rows, builder._sink is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reads", type=int, default=50)
    args = ap.parse_args()

    from conftest import fixture_dir

    import statequery
    from statequery.io import FileIO

    print(f"load average before: {os.getloadavg()}")
    print(f"{'state':46} {'mode':5} {'entries':>8} {'rows':>8} {'compiled s':>10} "
          f"{'pure s':>8} {'speed-up':>8}  compiled entries/CPU-s")
    opened: dict[str, Any] = {}
    for name, state, mode in STATES:
        sp = opened.setdefault(
            name, statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False))
        op, ref = _find(sp, state)
        sid, prefix_len, entries = _entries(sp, op, ref, mode)
        if not entries:
            print(f"{name}:{state}: no entries in the fixture")
            continue
        buf = _key_group(sid, prefix_len, entries, args.entries)
        best: dict[bool, float] = {}
        rows = 0
        took = False
        for pure in (False, True):
            for _ in range(args.repeat):
                dt, rows, compiled = _decode(ref, mode, buf, sid, prefix_len, pure)
                best[pure] = min(best.get(pure, dt), dt)
                if not pure:
                    took = compiled
        label = f"{name.split('-')[0]}:{state}"
        print(f"{label:46} {mode:5} {args.entries:8d} {rows:8d} {best[False]:10.3f} "
              f"{best[True]:8.3f} {best[True] / best[False]:7.1f}x  "
              f"{args.entries / best[False]:,.0f}{'' if took else '  (NOT compiled)'}")
    print("\nhashmap checkpoint format (HeapBlockDecoder), state blocks repeated:")
    for name, state, mode in HEAP_STATES:
        sp = opened.setdefault(
            name, statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False))
        op, ref = _find(sp, state)
        caught = _heap_block(sp, op, ref, mode)
        if caught is None:
            continue
        block, n = caught
        times = max(1, args.entries // n)
        best = {}
        for pure in (False, True):
            for _ in range(args.repeat):
                dt, rows, compiled = _heap_decode(ref, mode, block * times, n * times, pure)
                best[pure] = min(best.get(pure, dt), dt)
                if not pure:
                    took = compiled
        label = f"{name.split('-')[0]}:{state}"
        print(f"{label:46} {mode:5} {n * times:8d} {rows:8d} {best[False]:10.3f} "
              f"{best[True]:8.3f} {best[True] / best[False]:7.1f}x  "
              f"{n * times / best[False]:,.0f}{'' if took else '  (NOT compiled)'}")
    print(f"\nfull reads of the fixtures' states ({args.reads} reads each, CPU s per read):")
    for name, state, mode in STATES:
        sp = opened[name]
        op, ref = _find(sp, state)
        per: dict[bool, float] = {}
        for pure in (False, True):
            _use(pure)
            t = time.process_time()
            for _ in range(args.reads):
                n = sp.read(op, state, mode=mode).num_rows
            per[pure] = (time.process_time() - t) / args.reads
        print(f"  {name}:{state} ({mode}, {n} rows): compiled {per[False] * 1e3:.2f} ms, "
              f"pure {per[True] * 1e3:.2f} ms")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
