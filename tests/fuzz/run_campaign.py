"""Whole-file mutation campaign: both decode paths on mutated copies of real fixtures.

Usage (by hand; nothing in CI runs the long form)::

    nice -n 19 python tests/fuzz/run_campaign.py --budget 600 --seed 1 --out report.json
    python tests/fuzz/run_campaign.py --replay '<one "case" object of a report, as JSON>'

For each input a private copy of a real fixture (``tests/fixtures``) has one of its files mutated
(bit flips, byte sets, truncation, a 4-byte length field inflated to 0x7fffffff / 0xffffffff /
0x80000000 / the largest varint32, a chunk duplicated or deleted), then the whole savepoint is
opened with :func:`statequery.open` and every state of ``state_meta()`` read, first on the
compiled path, then on the pure-Python path (``STATEQUERY_PURE_PYTHON=1``). A mutated RocksDB
table is also walked with the SST reader directly (:func:`statequery.backends.sst.merged_entries`,
compiled ``_sst`` vs pure), since a full read hands most column families to rocksdict.

The reads run in a worker subprocess, so a segfault or abort is seen as a signal exit and a hang
as a missed deadline (the worker is killed and restarted). Outcome classes:

* ``rows``: both paths returned identical tables (fine);
* ``typed``: both raised the same :class:`~statequery.exceptions.StatequeryError` class (fine);
* ``typed-class-differs``: both typed, different classes (reported, minor);
* ``rows-vs-error``: one path returned rows, the other raised (bug);
* ``rows-differ``: both returned rows, not the same (bug);
* ``untyped``: either path raised something that is not a ``StatequeryError`` (bug; includes
  SystemError, MemoryError, IndexError, ...);
* ``crash``: the worker died (signal or abort) (bug);
* ``hang``: no answer within ``--timeout`` seconds (bug).

``--python`` and ``--pythonpath`` run the worker on another build (the bounds-checked one of
tests/backends/test_sanitized.py, with ``--asan`` to preload its runtime).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

#: the fixtures mutated by default: every container format and serializer family the compiled
#: path decodes (canonical, hashmap checkpoint plain and snappy, RocksDB native, incremental,
#: canonical snappy and heap timers, changelog, SQL RowData, CEP, TTL + Kryo, the edge values,
#: length-suffixed composite keys)
DEFAULT_FIXTURES = [
    "datastream-hashmap-canonical",
    "datastream-hashmap-checkpoint",
    "datastream-hashmap-checkpoint-snappy",
    "datastream-rocksdb-native",
    "datastream-rocksdb-incremental-checkpoint",
    "datastream-rocksdb-canonical-snappy",
    "datastream-rocksdb-checkpoint-heaptimers",
    "changelog-hashmap-checkpoint",
    "changelog-rocksdb-checkpoint",
    "sql-hashmap-canonical",
    "sql-rocksdb-native",
    "sql-cep-hashmap-native",
    "sql-cep-rocksdb-native",
    "ttl-kryo-hashmap-canonical",
    "ttl-kryo-rocksdb-native",
    "edge-datastream-hashmap-canonical",
    "edge-sql-rocksdb-native",
    "sql-aggs-hashmap-canonical",
    "labels-rocksdb-native",
]

OPS = ["bitflip", "bitflips", "byteset", "truncate", "inflate", "dup", "delete"]
#: a RocksDB table: the same mutations inside one block (data, index, meta-index, properties),
#: then its checksum recomputed, so the mutated bytes reach the block parsers
SST_OPS = ["block-bitflip", "block-byteset", "block-inflate", "block-varint"]
#: a RocksDB table whose blocks are compressed: the mutation is applied to one block's bytes
#: after its checksum is verified and it is decompressed (``SstFile._decode_block``), where the
#: block walks (compiled ``_sst.block_tuples`` and the pure ``_Block``) start; ``header`` aims
#: at an entry's shared / non-shared / value-length varint
DECODED_OPS = ["decoded-bitflip", "decoded-byteset", "decoded-varint", "decoded-header"]
BIG_VARINTS = ["ffffffffffffffffff01", "ffffffff0f", "80808080808080808001", "ffffffffffffffffff7f",
               "00", "7f", "8001"]
INFLATE = [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\xff\xff\xff\xff\x0f",
           b"\x00\x00\x00\x00"]
BUGS = {"rows-vs-error", "rows-differ", "untyped", "crash", "hang"}


# -- fixtures and mutations (deterministic from the seed) ------------------------------------------

@functools.lru_cache(maxsize=1)
def _manifest() -> dict[str, Any]:
    return json.loads((FIXTURES / "manifest.json").read_text())  # type: ignore[no-any-return]


def fixture_record(name: str) -> dict[str, Any]:
    manifest = _manifest()
    for section in ("fixtures", "changelog"):
        for rec in manifest.get(section, []):
            if rec["name"] == name:
                return rec
    raise LookupError(f"no fixture {name!r} in the manifest")


@functools.cache
def fixture_files(name: str) -> tuple[Path, str, list[str]]:
    """(top directory to copy, savepoint path inside it, files to mutate relative to the top)."""
    rel = fixture_record(name)["path"]
    top = FIXTURES / rel.split("/")[0]
    files = sorted(str(p.relative_to(top)) for p in top.rglob("*")
                   if p.is_file() and p.stat().st_size > 0)
    return top, rel.split("/", 1)[1] if "/" in rel else "", files


def mutate(data: bytes, op: str, rng: random.Random) -> tuple[bytes, dict[str, Any]]:
    """``data`` changed by ``op``; the description replays it (see :func:`apply`)."""
    n = len(data)
    pos = rng.randrange(n)
    if op == "bitflip":
        m = {"op": op, "pos": pos, "bit": rng.randrange(8)}
    elif op == "bitflips":
        flips = [[rng.randrange(n), rng.randrange(8)] for _ in range(rng.randint(2, 8))]
        m = {"op": op, "flips": flips}
    elif op == "byteset":
        m = {"op": op, "pos": pos, "value": rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])}
    elif op == "truncate":
        m = {"op": op, "length": rng.choice([pos, n - rng.randint(1, min(n, 16))])}
    elif op == "inflate":
        m = {"op": op, "pos": pos, "bytes": rng.choice(INFLATE).hex()}
    elif op in ("dup", "delete"):
        m = {"op": op, "pos": pos, "length": rng.choice([1, 2, 4, 8, rng.randint(1, 512)])}
    else:
        raise ValueError(op)
    return apply(data, m), m


_TABLE_MAGIC = (0x88E241B785F4CFF7, 0xDB4775248B80FB57)  # block-based table, legacy


def is_table(path: Path) -> bool:
    """A RocksDB block-based table (Flink names them by UUID in savepoints: by its magic)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 48:
            return False
        f.seek(-8, os.SEEK_END)
        return int.from_bytes(f.read(8), "little") in _TABLE_MAGIC


def sst_blocks(path: Path) -> list[tuple[int, int]]:
    """``(offset, size)`` of every data block, the index, meta-index and properties blocks."""
    from statequery.backends.sst import SstFile

    with SstFile(str(path)) as t:
        blocks = [(h.offset, h.size) for _, h in t.data_block_handles()]
        blocks += [(h.offset, h.size) for h in (t.index_handle, t.metaindex_handle)]
        blocks += [(h.offset, h.size) for h in t.meta_blocks.values()]
    return sorted({b for b in blocks if b[1] > 0})


def mutate_block(path: Path, data: bytes, op: str,
                 rng: random.Random) -> tuple[bytes, dict[str, Any]]:
    offset, size = rng.choice(sst_blocks(path))
    pos = offset + rng.randrange(size)
    if op == "block-bitflip":
        m = {"op": "bitflip", "pos": pos, "bit": rng.randrange(8)}
    elif op == "block-byteset":
        m = {"op": "byteset", "pos": pos,
             "value": rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])}
    elif op == "block-inflate":
        m = {"op": "inflate", "pos": pos, "bytes": rng.choice(INFLATE).hex()}
    else:  # the largest varints: 5 bytes (varint32), 10 bytes (varint64, all 64 bits set)
        m = {"op": "inflate", "pos": pos,
             "bytes": rng.choice(["ffffffff0f", "ffffffffffffffffff01", "8080808080808080800101"])}
    m["pos"] = min(m["pos"], offset + size - len(bytes.fromhex(m.get("bytes", "00"))))
    m["pos"] = max(m["pos"], offset)
    m["resum"] = [offset, size]
    return apply(data, m), m


def mutate_decoded(path: Path, op: str, rng: random.Random) -> dict[str, Any]:
    offset, _ = rng.choice(sst_blocks(path))
    m: dict[str, Any] = {"op": op, "block": offset, "frac": rng.random()}
    if op == "decoded-bitflip":
        m["bit"] = rng.randrange(8)
    elif op == "decoded-byteset":
        m["value"] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    else:
        m["bytes"] = rng.choice(BIG_VARINTS)
        m["field"] = rng.randrange(3)
    return m


def _entry_headers(data: bytes) -> list[list[int]]:
    """Positions of each entry's three header varints in a decoded block (as far as they parse)."""
    from statequery.backends.sst import _Block, _varint

    try:
        limit = _Block(data, "", 0).limit
    except Exception:  # noqa: BLE001 - a block the mutation will not aim into
        return []
    out, pos = [], 0
    try:
        while pos < limit:
            fields = [pos]
            _, pos = _varint(data, pos)
            fields.append(pos)
            non_shared, pos = _varint(data, pos)
            fields.append(pos)
            value_len, pos = _varint(data, pos)
            out.append(fields)
            pos += non_shared + value_len
    except Exception:  # noqa: BLE001
        pass
    return out


def apply_decoded(data: bytes, m: dict[str, Any]) -> bytes:
    """The decoded block ``data`` changed as ``m`` (from :func:`mutate_decoded`) says."""
    b = bytearray(data)
    if not b:
        return data
    pos = min(int(m["frac"] * len(b)), len(b) - 1)
    op = m["op"]
    if op == "decoded-bitflip":
        b[pos] ^= 1 << m["bit"]
    elif op == "decoded-byteset":
        b[pos] = m["value"]
    elif op == "decoded-header":  # the varint replaced by another: the rest of the block moves
        from statequery.backends.sst import _varint

        headers = _entry_headers(data)
        if headers:
            pos = headers[min(int(m["frac"] * len(headers)), len(headers) - 1)][m["field"]]
            b[pos:_varint(data, pos)[1]] = bytes.fromhex(m["bytes"])
    else:  # overwritten in place
        field = bytes.fromhex(m["bytes"])
        b[pos:pos + len(field)] = field
        del b[len(data):]
    return bytes(b)


class _DecodedPatch:
    """While active, ``SstFile._decode_block`` of the block at ``m["block"]`` returns the block
    with ``m`` applied to its decoded bytes; the compiled table scan (``_sst.TableScan``, which
    reads and inflates blocks in C, past ``_decode_block``) is off, so both paths read the
    mutated block through ``read_block`` (the scan meets mutated bytes in the on-disk ops)."""

    def __init__(self, m: dict[str, Any] | None) -> None:
        self.m = m

    def __enter__(self) -> None:
        if self.m is None:
            return
        from statequery.backends import sst

        self.original = original = sst.SstFile._decode_block
        m = self.m

        def decode(table: Any, raw: bytes, handle: Any, delta_values: bool = False,
                   first_keys: bool = False) -> Any:
            block = original(table, raw, handle, delta_values, first_keys)
            if handle.offset != m["block"]:
                return block
            return sst._Block(apply_decoded(block.data, m), block.source, block.base,
                              delta_values, first_keys)

        sst.SstFile._decode_block = decode  # type: ignore[method-assign]
        from statequery.backends import rocksdb

        self.scan = rocksdb.table_scan
        rocksdb.table_scan = lambda *a, **k: None  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        if self.m is not None:
            from statequery.backends import rocksdb, sst

            sst.SstFile._decode_block = self.original  # type: ignore[method-assign]
            rocksdb.table_scan = self.scan  # type: ignore[assignment]


def resum(b: bytearray, offset: int, size: int, original: bytes) -> None:
    """Recompute the checksum of the block at ``offset`` (RocksDB's trailer: compression type,
    then the 32-bit checksum of block and type, plus the context modifier of format 6)."""
    import struct

    from statequery.backends.checksums import context_modifier
    from statequery.backends.sst import SstFile

    with tempfile.NamedTemporaryFile(suffix=".sst") as f:
        f.write(original)
        f.flush()
        with SstFile(f.name) as t:
            fn, base = t._checksum, t._base_context
    if fn is None:
        return
    value = fn(bytes(b[offset:offset + size + 1]), size + 1)
    if base:
        value = (value + context_modifier(base, offset)) & 0xFFFFFFFF
    struct.pack_into("<I", b, offset + size + 1, value)


def apply(data: bytes, m: dict[str, Any]) -> bytes:
    b = bytearray(data)
    op = m["op"]
    if op in DECODED_OPS:
        return data  # applied when the block is decoded (_DecodedPatch)
    if op == "bitflip":
        b[m["pos"]] ^= 1 << m["bit"]
    elif op == "bitflips":
        for pos, bit in m["flips"]:
            b[pos] ^= 1 << bit
    elif op == "byteset":
        b[m["pos"]] = m["value"]
    elif op == "truncate":
        del b[m["length"]:]
    elif op == "inflate":
        field = bytes.fromhex(m["bytes"])
        b[m["pos"]:m["pos"] + len(field)] = field
    elif op == "dup":
        b[m["pos"]:m["pos"]] = b[m["pos"]:m["pos"] + m["length"]]
    elif op == "delete":
        del b[m["pos"]:m["pos"] + m["length"]]
    if "resum" in m:
        resum(b, *m["resum"], original=data)
    return bytes(b)


def cases(fixtures: list[str], seed: int, ops: list[str] = OPS) -> Any:
    """An endless, seeded stream of cases: round-robin over the fixtures; in each fixture the
    state files (not ``_metadata``) are picked three times as often as ``_metadata``."""
    rng = random.Random(seed)
    files = {f: fixture_files(f)[2] for f in fixtures}
    tables = {(f, p) for f in fixtures for p in files[f]
              if is_table(fixture_files(f)[0] / p)}
    i = 0
    while True:
        fx = fixtures[i % len(fixtures)]
        names = files[fx]
        weights = [1 if Path(p).name == "_metadata" else 3 for p in names]
        target = rng.choices(names, weights)[0]
        op = ops[rng.randrange(len(ops))]
        if (fx, target) in tables and rng.random() < 0.7:
            op = rng.choice(SST_OPS + DECODED_OPS + DECODED_OPS)
        yield {"index": i, "fixture": fx, "file": target, "op": op, "seed": rng.randrange(1 << 30)}
        i += 1


# -- the worker: reads one mutated copy on both paths ----------------------------------------------

def _plain(t: Any) -> Any:
    """``t`` with every temporal type as the integer Arrow stores (a mutated timestamp can be
    outside Python's datetime range; its rows must still compare)."""
    import pyarrow as pa

    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or (
            pa.types.is_time64(t)):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_plain(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_plain(t.key_type)),
                       t.item_field.with_type(_plain(t.item_type)))
    return t


def _rows_key(table: Any) -> str:
    # repr of the rows: NaN equals NaN, -0.0 differs from 0.0, chunking does not matter
    import pyarrow as pa

    plain = pa.schema([f.with_type(_plain(f.type)) for f in table.schema])
    return f"{table.schema}\n{table.cast(plain).to_pylist()!r}"


def _read_all(location: str) -> Any:
    import statequery
    from statequery.io import FileIO

    out = {}
    with statequery.open(location, io=FileIO(), use_snapshot=False, max_workers=1) as sp:
        for t in sp.state_meta().column("table_name").to_pylist():
            out[t] = _rows_key(sp.read(t))
    return out


def _read_sst(path: str) -> Any:
    from statequery.backends.sst import SstFile, merged_entries

    with SstFile(path) as table:
        return repr(list(merged_entries([table])))


class Worker:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.copies: dict[str, tuple[Path, str]] = {}

    def copy(self, fixture: str) -> tuple[Path, str]:
        if fixture not in self.copies:
            top, inner, _ = fixture_files(fixture)
            dest = self.work / "fx" / top.name
            shutil.copytree(top, dest)
            self.copies[fixture] = (dest, inner)
        return self.copies[fixture]

    def outcome(self, fn: Any, arg: str, pure: bool) -> tuple[str, str]:
        from statequery.exceptions import StatequeryError

        os.environ["STATEQUERY_PURE_PYTHON"] = "1" if pure else ""
        # a fresh cache per read: the mutated bytes keep the file's name (and often its size)
        cache = self.work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        try:
            return "rows", json.dumps(fn(arg))
        except StatequeryError as e:
            return "typed", f"{type(e).__name__}: {e}"[:400]
        except BaseException as e:  # noqa: BLE001 - everything else is the finding
            return "untyped", (f"{type(e).__name__}: {e}"[:400] + "\n"
                               + traceback.format_exc()[-1500:])

    def run(self, case: dict[str, Any]) -> dict[str, Any]:
        top, inner = self.copy(case["fixture"])
        path = top / case["file"]
        original = path.read_bytes()
        table = is_table(path)
        if case.get("mutation") is not None:  # a replay (a crash records only the seed)
            data = apply(original, case["mutation"])
        else:
            rng = random.Random(case["seed"])
            if case["op"] in SST_OPS:
                data, case["mutation"] = mutate_block(path, original, case["op"], rng)
            elif case["op"] in DECODED_OPS:
                case["mutation"] = mutate_decoded(path, case["op"], rng)
                data = original
            else:
                data, case["mutation"] = mutate(original, case["op"], rng)
        try:
            path.write_bytes(data)
            what = [(_read_all, str(top / inner) if inner else str(top))]
            if table:
                what.append((_read_sst, str(path)))
            results = []
            m = case["mutation"]
            with _DecodedPatch(m if m["op"] in DECODED_OPS else None):
                for fn, arg in what:
                    fast = self.outcome(fn, arg, pure=False)
                    pure = self.outcome(fn, arg, pure=True)
                    results.append(classify(fast, pure))
        finally:
            path.write_bytes(original)
        worst = max(results, key=lambda r: r["class"] in BUGS)
        return {**worst, "reads": [r["class"] for r in results], "mutation": case["mutation"]}


def classify(fast: tuple[str, str], pure: tuple[str, str]) -> dict[str, Any]:
    if "untyped" in (fast[0], pure[0]):
        cls = "untyped"
    elif fast[0] == pure[0] == "rows":
        cls = "rows" if fast[1] == pure[1] else "rows-differ"
    elif fast[0] == pure[0] == "typed":
        same = fast[1].split(":")[0] == pure[1].split(":")[0]
        cls = "typed" if same else "typed-class-differs"
    else:
        cls = "rows-vs-error"
    detail = {} if cls == "rows" else {
        "compiled": fast[1][:2000] if fast[0] != "rows" else "rows",
        "pure": pure[1][:2000] if pure[0] != "rows" else "rows"}
    if cls == "rows-differ":
        detail["compiled"], detail["pure"] = _first_difference(fast[1], pure[1])
    return {"class": cls, "detail": detail}


def _first_difference(a: str, b: str) -> tuple[str, str]:
    x, y = json.loads(a), json.loads(b)
    if isinstance(x, str):
        x, y = {"": x}, {"": y}
    for k in x:
        if x[k] != y.get(k):
            i = next((i for i, (p, q) in enumerate(zip(x[k], y[k], strict=False)) if p != q), 0)
            lo, hi = max(0, i - 200), i + 300
            return f"{k}: ...{x[k][lo:hi]}", f"{k}: ...{y[k][lo:hi]}"
    return "keys " + repr(sorted(x)), "keys " + repr(sorted(y))


def worker_main() -> None:
    work = Path(tempfile.mkdtemp(prefix="sq-campaign-"))
    os.environ["STATEQUERY_CACHE_DIR"] = str(work / "cache")
    w = Worker(work)
    try:
        for line in sys.stdin:
            case = json.loads(line)
            print(json.dumps({"ok": w.run(case)}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the driver --------------------------------------------------------------------------------

class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.proc: subprocess.Popen[str] | None = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("STATEQUERY_PURE_PYTHON", None)
        if self.args.pythonpath:
            env["PYTHONPATH"] = self.args.pythonpath
        if self.args.asan:
            out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                                 text=True, check=True).stdout.strip()
            env.update(LD_PRELOAD=str(Path(out).resolve()), PYTHONMALLOC="malloc",
                       ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0",
                       UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
        return env

    def start(self) -> subprocess.Popen[str]:
        if self.proc is None:
            self.errlog = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen(
                [self.args.python, str(Path(__file__).resolve()), "--worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog, text=True,
                env=self._env(), cwd=tempfile.gettempdir())
        return self.proc

    def stop(self) -> str:
        p, self.proc = self.proc, None
        if p is None:
            return ""
        if p.poll() is None:
            p.kill()
        p.wait()
        self.errlog.seek(0)
        text = self.errlog.read()
        self.errlog.close()
        # a sanitizer's verdict (its first lines), then the end of the worker's stderr
        verdict = [line for line in text.splitlines()
                   if "runtime error" in line or "ERROR: AddressSanitizer" in line
                   or line.startswith(("SUMMARY:", "Fatal Python error"))]
        return f"exit {p.returncode}\n" + "\n".join(verdict[:5]) + "\n...\n" + text[-3000:]

    def run(self, case: dict[str, Any]) -> dict[str, Any]:
        p = self.start()
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(json.dumps(case) + "\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], self.args.timeout)
        if not ready:
            return {"class": "hang", "detail": {"worker": self.stop()[-1500:]}}
        line = p.stdout.readline()
        if not line:
            return {"class": "crash", "detail": {"worker": self.stop()}}
        return json.loads(line)["ok"]


def recheck(args: argparse.Namespace) -> dict[str, Any]:
    """Every finding of an earlier report, run again (the same mutated bytes) on this tree."""
    findings = json.loads(Path(args.recheck).read_text())["findings"]
    driver = Driver(args)
    out: Counter[str] = Counter()
    still = []
    try:
        for f in findings:
            r = driver.run(f["case"])
            out[r["class"]] += 1
            if r["class"] not in ("rows", "typed"):
                still.append({"case": f["case"], **r})
    finally:
        driver.stop()
    return {"rechecked": len(findings), "outcomes": dict(out), "findings": still}


def campaign(args: argparse.Namespace) -> dict[str, Any]:
    driver = Driver(args)
    per_fixture: dict[str, Counter[str]] = defaultdict(Counter)
    per_op: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    findings: list[dict[str, Any]] = []
    t0 = time.monotonic()
    cpu0 = _children_cpu()
    n = 0
    try:
        for case in cases(args.fixtures, args.seed, args.ops):
            if time.monotonic() - t0 > args.budget or (args.inputs and n >= args.inputs):
                break
            r = driver.run(dict(case))
            n += 1
            cls = r["class"]
            totals[cls] += 1
            per_fixture[case["fixture"]][cls] += 1
            per_op[case["op"]][cls] += 1
            if cls not in ("rows", "typed"):
                findings.append({"case": {**case, "mutation": r.get("mutation")}, **r})
                if not args.quiet:
                    print(f"[{n}] {cls}: {case['fixture']} {case['file']} {case['op']}",
                          file=sys.stderr, flush=True)
    finally:
        driver.stop()
    return {
        "seed": args.seed, "fixtures": args.fixtures, "pythonpath": args.pythonpath,
        "asan": args.asan, "inputs": n, "wall_seconds": round(time.monotonic() - t0, 1),
        "worker_cpu_seconds": round(_children_cpu() - cpu0, 1),
        "outcomes": dict(totals),
        "per_fixture": {k: dict(v) for k, v in per_fixture.items()},
        "per_op": {k: dict(v) for k, v in per_op.items()},
        "findings": findings,
    }


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=300, help="seconds of wall time")
    ap.add_argument("--inputs", type=int, default=0, help="stop after this many inputs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60, help="seconds per input (both paths)")
    ap.add_argument("--fixtures", nargs="*", default=DEFAULT_FIXTURES)
    ap.add_argument("--ops", nargs="*", default=OPS, choices=OPS)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pythonpath", default=str(ROOT))
    ap.add_argument("--asan", action="store_true", help="preload the AddressSanitizer runtime")
    ap.add_argument("--replay", help="one case (JSON, with its mutation) to run in this process")
    ap.add_argument("--recheck", help="run the findings of this report again")
    ap.add_argument("--out", help="write the JSON report here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.replay:
        sys.path.insert(0, args.pythonpath)
        work = Path(tempfile.mkdtemp(prefix="sq-replay-"))
        os.environ["STATEQUERY_CACHE_DIR"] = str(work / "cache")
        try:
            print(json.dumps(Worker(work).run(json.loads(args.replay)), indent=1))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    report = recheck(args) if args.recheck else campaign(args)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    summary = {k: v for k, v in report.items() if k != "findings"}
    print(json.dumps(summary, indent=1))
    return 1 if any(f["class"] in BUGS for f in report["findings"]) else 0


if __name__ == "__main__":
    sys.exit(main())
