"""The compiled decode path under memory checking (issue 19, item 3).

Builds the checked variant of ``_read`` and ``_sst`` (``STATEQUERY_BOUNDSCHECK=1`` in setup.py:
Cython ``boundscheck``/``wraparound``/``initializedcheck`` and gcc's AddressSanitizer and
UndefinedBehaviorSanitizer) into a copy of the package in a temporary directory, and runs the
fast-path suite (every real fixture on both paths), the differential harness and the corruption
tests against it in a subprocess, with the ASan runtime preloaded and Python's allocator switched
to malloc (``PYTHONMALLOC=malloc``: every bytes object gets its own allocation with ASan redzones,
so a read past a value's bytes is reported, not silently taken from the next object).

Any out-of-bounds read or write, use of uninitialised memory views or undefined behaviour in the
compiled code aborts the subprocess with the sanitizer's report; the test shows it.
``test_the_checked_build_catches_an_out_of_bounds_read`` proves that on a planted bug.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# not tests/reader/test_fixture_oracle.py: it compares the fixtures' two JSONL descriptions and
# never # imports statequery, so under the checked build it ran no compiled code at all (the normal
# suite runs it)
SUITES = [
    "tests/backends/test_fastpath.py",
    # (with its keyed properties: lookups through the compiled key filter, _read.KeyFilter)
    "tests/backends/test_differential.py",
    "tests/backends/test_corruption.py",
    # the compiled SST block walk on mutated real blocks (the campaign's finds)
    "tests/backends/test_mutations.py::test_a_huge_shared_prefix_is_corrupt_on_both_paths",
    "tests/backends/test_mutations.py::test_block_walks_agree_on_every_header_varint",
    # the compiled pre-check of a RocksDB table's blocks (issue 33 item 3), also via the
    # differential module above; its fixture tables and the crashes it refuses
    "tests/backends/test_mutations.py::test_malformed_blocks_are_refused_before_rocksdb_reads_them",
    # the compiled table scan of RocksDB column families and its packed feed (issue 33 item 3)
    "tests/backends/test_table_scan.py",
    # the lookups' kept key-group index (_keyindex) on fixtures and on mutated key groups
    "tests/backends/test_keyindex.py",
    # a pool worker's buffers built into its result slot (_read.arena_set), read back over a
    # mapping, and one kept after its item
    "tests/reader/test_parallel.py::test_a_reads_buffers_are_built_in_the_slot_not_copied",
    "tests/reader/test_parallel.py::test_a_buffer_kept_after_its_item_retires_its_slot",
]


def _runtime() -> str:
    """The AddressSanitizer runtime of the C compiler that builds the extension."""
    cc = os.environ.get("CC", "gcc")
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(out)
    assert path.is_absolute() and path.exists(), f"{cc} has no AddressSanitizer runtime ({out})"
    return str(path.resolve())


def _build_key(source: Path) -> str:
    """What the checked extensions are compiled from: their Cython sources, setup.py, the
    interpreter, Cython and the C compiler. The same key gives the same ``.so`` files."""
    cc = os.environ.get("CC", "gcc")
    compiler = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    import Cython

    h = hashlib.sha256()
    for part in (sys.version, sys.platform, Cython.__version__, compiler, cc,
                 os.environ.get("CFLAGS", ""), os.environ.get("LDFLAGS", "")):
        h.update(part.encode() + b"\0")
    for path in [source / "setup.py", *sorted((source / "statequery").rglob("*.pyx")),
                 *sorted((source / "statequery").rglob("*.pxd")),
                 *sorted((source / "statequery").rglob("*.pxi"))]:
        h.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def _build(dest: Path, source: Path = ROOT) -> Path:
    """A copy of the package with the checked extensions; returns the directory to put first
    on ``PYTHONPATH``.

    The compiled ``.so`` files are kept in ``build/sanitized/<key>/`` of this checkout (git
    ignores ``build/``), ``key`` the hash of what they are compiled from (``_build_key``): a
    later run with the same sources copies them instead of compiling again (about a minute of
    Cython and gcc with the sanitizers). The package's Python files are always today's."""
    pkg = dest / "statequery"
    shutil.copytree(source / "statequery", pkg,
                    ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    cache = ROOT / "build" / "sanitized" / _build_key(source)
    if not sorted(cache.glob("_*.so")):
        fresh = dest / "_fresh"
        env = dict(os.environ, STATEQUERY_BOUNDSCHECK="1")
        env.pop("STATEQUERY_NO_EXTENSIONS", None)
        r = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--build-lib", str(fresh), "--build-temp",
             str(dest / "_build"), "-q"],
            cwd=source, env=env, capture_output=True, text=True,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        partial = cache.with_name(f"{cache.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for so in (fresh / "statequery" / "backends").glob("_*.so"):
            shutil.copy2(so, partial / so.name)
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(partial, cache)  # whole or not at all
        shutil.rmtree(fresh)
    for so in cache.glob("_*.so"):
        shutil.copy2(so, pkg / "backends" / so.name)
    built = sorted(p.name for p in (pkg / "backends").glob("_*.so"))
    assert [n.split(".")[0] for n in built] == ["_keyindex", "_read", "_sst"], built
    return dest


def _env(path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(path),
        LD_PRELOAD=_runtime(),
        # leaks: CPython keeps interned objects alive at exit; abort (not exit) on the first
        # error so the run cannot pass after a report
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        PYTHONMALLOC="malloc",
        PYTHONFAULTHANDLER="1",
    )
    # fewer generated examples than the plain run (which has 60 differential and 30
    # corruption examples per property): the checked build is several times slower, and the
    # point here is memory errors on every code path, which the fixtures already walk
    env.setdefault("STATEQUERY_FUZZ_EXAMPLES", "20")
    env.pop("STATEQUERY_PURE_PYTHON", None)
    return env


def _run(path: Path, args: list[str], timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``path`` (not the checkout: ``sys.path[0]`` is the working directory,
    whose ``statequery`` would shadow the checked copy)."""
    return subprocess.run([sys.executable, *args], cwd=path, env=_env(path),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def checked_build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.environ.get("STATEQUERY_NO_EXTENSIONS"):
        pytest.skip("no C compiler on this machine (STATEQUERY_NO_EXTENSIONS)")
    return _build(tmp_path_factory.mktemp("checked"))


@pytest.mark.slow
def test_suites_pass_on_the_checked_build(checked_build: Path) -> None:
    probe = _run(checked_build, ["-c", "import statequery.backends._read as r, "
                                       "statequery.backends.fastpath as f; "
                                       "print(r.__file__, f.compiled() is r)"])
    assert probe.returncode == 0, probe.stderr[-3000:]
    where, same = probe.stdout.split()
    assert Path(where).is_relative_to(checked_build) and same == "True", probe.stdout
    r = _run(checked_build, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                             "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                             *(str(ROOT / s) for s in SUITES)])
    tail = (r.stdout[-6000:] + "\n" + r.stderr[-8000:]).strip()
    assert r.returncode == 0, f"checked build: exit {r.returncode}\n{tail}"
    assert " passed" in r.stdout, tail


# a lookup of a real fixture's key (canonical hashmap and RocksDB savepoints): the compiled
# key filter (``_read.KeyFilter`` in the canonical walk, called per pair on RocksDB)
_LOOKUP = """
import sys
import statequery
from statequery.backends import fastpath
from statequery.backends.keygroups import CompositeEntryDecoder
from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
sp = statequery.open(sys.argv[1], use_snapshot=False)
layout = next(s for op in sp.keyed_operators() for s in op.states
              if s.kind == "value")
decoder = CompositeEntryDecoder(layout, None, BatchBuilder(state_schema(layout), layout), [b"k"])
assert isinstance(decoder.on_entry, fastpath.compiled().KeyFilter), decoder.on_entry
print(sum(t.num_rows for t in sp.lookup(sys.argv[2]).values()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-canonical"])
def test_lookups_on_the_checked_build(checked_build: Path, name: str) -> None:
    from conftest import dump_entries, fixture_dir

    key = next(e["key"] for e in dump_entries(name) if isinstance(e.get("key"), str))
    r = _run(checked_build, ["-c", _LOOKUP, str(fixture_dir(name)), key], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 0, r.stdout


# a bug planted in a copy of _read.pyx: the fixed-width read no longer checks the end of its
# data, so a truncated long reads past the value's bytes
_PLANT = ("            if pos + w > end:\n"
          "                raise DecodeError(\"value runs past the end of the data\", pos)\n")


@pytest.mark.slow
def test_the_checked_build_catches_an_out_of_bounds_read(
        tmp_path: Path, checked_build: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "statequery", src / "statequery",
                    ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    pyx = src / "statequery" / "backends" / "_read.pyx"
    text = pyx.read_text()
    assert text.count(_PLANT) == 1
    pyx.write_text(text.replace(_PLANT, ""))
    planted = _build(tmp_path / "planted", src)
    # a list element (a long) of 3 bytes at the end of its bytes object
    code = (
        "from statequery.backends import _read\n"
        "sink = _read.EntrySink(_read.K_LIST, _read.T_LONG, _read.T_LONG)\n"
        "key = bytes(9)\n"
        "sink(key + b'\\x01\\x02\\x03', 0, 9, 9, 12, 0)\n"
    )
    r = _run(planted, ["-c", code], timeout=300)
    assert r.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-3000:]
    # the same call on the real checked build: a typed error, no report
    r = _run(checked_build, ["-c", code.replace(
        "sink(", "from statequery.decoder import DecodeError\ntry:\n    sink(") + (
        "except DecodeError as e:\n    print('DecodeError', e)\n")], timeout=300)
    assert r.returncode == 0 and "DecodeError" in r.stdout, r.stderr[-3000:]
