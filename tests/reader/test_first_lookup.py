"""The first lookup of a process (issue 33 item 4): what it must not pay for.

Its rows are built from the compiled decoder's Arrow buffers, never by converting Python lists:
pyarrow's first conversion of a list in a process imports pandas (to ask whether the list is a
pandas object), ~0.8 CPU-s, most of what a first ``lookup`` used to cost. And the key filter of
the canonical walk compares keys in C (no Python call per skipped entry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import dump_entries, fixture_dir

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.backends import fastpath

NAMES = ["datastream-hashmap-canonical", "datastream-rocksdb-canonical"]

CHILD = """
import json, sys
import pyarrow, statequery
sp = statequery.open(sys.argv[1], use_snapshot=False)
found = sp.lookup(sys.argv[2])
print(json.dumps({"rows": sum(t.num_rows for t in found.values()),
                  "pandas": "pandas" in sys.modules}))
"""


def _a_key(name: str) -> str:
    return next(e["key"] for e in dump_entries(name) if isinstance(e.get("key"), str))


@pytest.mark.parametrize("name", NAMES)
def test_first_lookup_imports_no_pandas(name: str) -> None:
    assert fastpath.compiled() is not None or os.environ.get("STATEQUERY_NO_EXTENSIONS")
    env = {k: v for k, v in os.environ.items() if k != fastpath.PURE_ENV}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(fixture_dir(name)), _a_key(name)],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] > 0
    assert got["pandas"] is False


def test_lookup_key_filter_is_compiled() -> None:
    import statequery
    from statequery.backends.keygroups import CompositeEntryDecoder

    mod = fastpath.compiled()
    assert mod is not None
    sp = statequery.open(str(fixture_dir(NAMES[0])), use_snapshot=False)
    layout = next(s for op in sp.keyed_operators() for s in op.states
                  if s.kind == "value")
    builder = BatchBuilder(state_schema(layout), layout)
    decoder = CompositeEntryDecoder(layout, None, builder, key_bytes=[b"\x00\x01a"])
    assert isinstance(decoder.on_entry, mod.KeyFilter)
