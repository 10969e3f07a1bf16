"""Avro value decoding (docs/avro.md): statequery's reader against fastavro. Prints figures (not a
timed test).

    python benchmarks/bench_avro.py [--repeat 2000]

The values are the real bytes Flink's ``AvroSerializer`` wrote for the ``everything`` state of
``tests/fixtures/types-avro-hashmap-canonical`` (8 records, every Avro type and logical type),
captured while statequery reads them. Figures, CPU seconds per value (best of 3):

* statequery's reader (``statequery.serializers.avro``) on those bytes;
* fastavro's ``schemaless_reader`` on the same bytes: it expects Avro's binary encoding (zig-zag
  varints, little-endian floats), not Flink's ``DataOutputEncoder`` form, so it fails or
  returns other values; it cannot be the fast path;
* for scale, fastavro on the same records in Avro's own binary encoding (``schemaless_writer``).

fastavro is optional (``pip install fastavro``); without it only the first figure is printed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _capture() -> tuple[str, list[bytes]]:
    """The writer schema and the raw value bytes of the ``everything`` state."""
    import statequery
    import statequery.serializers.avro as avro
    from statequery.serializers.readers import ReadAt

    captured: list[bytes] = []
    real = avro.avro_reader

    def spying(t: avro.AvroType) -> ReadAt:
        read = real(t)
        if t.name != "statequery.avro.Everything":
            return read

        def spy(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            value, new = read(buf, pos, end)
            captured.append(bytes(buf[pos:new]))
            return value, new

        return spy

    avro.avro_reader = spying  # type: ignore[assignment]
    from conftest import fixture_dir

    sp = statequery.open(str(fixture_dir("types-avro-hashmap-canonical")), use_snapshot=False)
    sp.read("avro_state__everything")
    avro.avro_reader = real  # type: ignore[assignment]
    spec = next(s.value_spec for op in sp.model.meta.operators for s in op.states
                if s.name == "everything")
    return spec.schema, captured  # type: ignore[union-attr]


def _best(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        fn(repeat)
        best = min(best, time.process_time() - t0)
    return best


def _plain(t: Any, v: Any) -> Any:
    """A decoded value in the form fastavro's writer takes (unions unwrapped, maps as dicts)."""
    if v is None:
        return None
    if t.kind == "union":
        members = [b for b in t.branches if b.kind != "null"]
        if len(members) == 1:
            return _plain(members[0], v)
        from statequery.serializers.avro import union_member_names

        names = union_member_names(t)
        for b, n in zip(members, names, strict=True):
            if v[n] is not None:
                return _plain(b, v[n])
        return None
    if t.kind == "record":
        return {n: _plain(f, v[n]) for n, f in t.fields}
    if t.kind == "array":
        return [_plain(t.items, x) for x in v]
    if t.kind == "map":
        return {k: _plain(t.items, x) for k, x in v}
    if t.kind == "fixed" and t.logical == "uuid":
        import uuid

        return uuid.UUID(v).bytes
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    from statequery.serializers.avro import avro_reader, parse_schema

    schema, values = _capture()
    t = parse_schema(schema)
    read = avro_reader(t)
    n = len(values)
    print(f"load average {os.getloadavg()[0]:.2f}; {n} values, "
          f"{sum(map(len, values)) // n} bytes each on average")

    def ours(repeat: int) -> None:
        for _ in range(repeat):
            for b in values:
                read(b, 0, len(b))

    s = _best(ours, args.repeat)
    print(f"statequery reader, Flink's bytes: {s / (args.repeat * n) * 1e6:.1f} us/value")
    try:
        import fastavro
    except ImportError:
        print("fastavro not installed: no comparison")
        return
    parsed = fastavro.parse_schema(json.loads(schema))
    ok = 0
    for b in values:
        try:
            got = fastavro.schemaless_reader(io.BytesIO(b), parsed, None)
            ok += got == read(b, 0, len(b))[0]
        except Exception:  # noqa: BLE001 -- any failure counts: these are not Avro binary
            pass
    print(f"fastavro on Flink's bytes: {ok} of {n} values decoded to the same value")
    binary = []
    for b in values:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, _plain(t, read(b, 0, len(b))[0]))
        binary.append(out.getvalue())

    def theirs(repeat: int) -> None:
        for _ in range(repeat):
            for b in binary:
                fastavro.schemaless_reader(io.BytesIO(b), parsed, None)

    s2 = _best(theirs, args.repeat)
    print(f"fastavro, the same records in Avro binary: {s2 / (args.repeat * n) * 1e6:.1f} us/value")


if __name__ == "__main__":
    main()
