"""Reading a whole savepoint in a child process, and comparing entry lists.

Used by reader/test_edge_fixtures.py and serializers/test_avro.py: a crash of a decoder (segfault,
abort) in the child is the calling test's failure, with the state being read named, rather than
the end of the test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from statequery.backends import fastpath

REPO = Path(__file__).resolve().parents[2]
SHOW = 10

# Prints one line per entry (sorted), and one {"$error": ...} line per state that failed to read.
# "$reading" lines on stderr name the state being read, for a crash report.
_CHILD = r"""
import json, sys
import statequery
from tests.support.entries import canonical, state_entries
from statequery.io import FileIO
from statequery.reader import list_states, read_table

sp = statequery.open(sys.argv[1], io=FileIO(), use_snapshot=False)
lines = []
for op in sp.metadata.operators:
    for ref in list_states(sp, op):
        print("$reading", op.uid or op.name, ref.name, file=sys.stderr, flush=True)
        try:
            table = read_table(sp, op, ref.name)
        except Exception as e:
            lines.append(canonical({"$error": f"{op.uid or op.name} / {ref.name}: "
                                              f"{type(e).__name__}: {e}"[:500]}))
            continue
        lines.extend(canonical(e) for e in state_entries(
            table, ref.kind, ref.name, op.uid or "", op.operator_id, True))
sys.stdout.write("".join(line + "\n" for line in sorted(lines)))
"""


def read_in_child(name: str, location: Path, pure: bool) -> tuple[list[str], str]:
    """The sorted canonical entries of every state of the savepoint at ``location`` (fixture
    ``name``), read in a child process on the compiled or the pure path, and its stderr; a
    crash of the child fails the test naming the state being read."""
    env = dict(os.environ)
    env.pop(fastpath.PURE_ENV, None)
    if pure:
        env[fastpath.PURE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _CHILD, str(location)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    if proc.returncode != 0:
        reading = [x for x in proc.stderr.splitlines() if x.startswith("$reading")]
        where = reading[-1][len("$reading "):] if reading else "?"
        pytest.fail(
            f"{name}: the reader process died (exit {proc.returncode}) while reading {where}\n"
            + "\n".join(proc.stderr.splitlines()[-15:]),
            pytrace=False,
        )
    return proc.stdout.splitlines(), proc.stderr


def differences(mine: list[str], theirs: list[str]) -> str:
    """What differs between two lists of canonical entries, counted per state, with the first
    ``SHOW`` of each side."""
    a, b = Counter(mine), Counter(theirs)
    only_mine = sorted((a - b).elements())
    only_theirs = sorted((b - a).elements())
    per_state: Counter[str] = Counter()
    for line in only_mine + only_theirs:
        e = json.loads(line)
        per_state[e.get("$error", "").split(":")[0] or f"{e['operator_uid']} / {e['state']}"] += 1
    return (
        f"{len(only_mine)} entries only in statequery, {len(only_theirs)} only in Flink's dump; "
        f"per state: {dict(per_state)}\n"
        + "\n".join("  statequery: " + x[:300] for x in only_mine[:SHOW])
        + "\n"
        + "\n".join("  dump:       " + x[:300] for x in only_theirs[:SHOW])
    )
