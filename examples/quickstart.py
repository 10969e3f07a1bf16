"""Look at one key of a savepoint from plain Python (no Spark, no JVM).

    python examples/quickstart.py [SAVEPOINT] [KEY]

Defaults to the shipped catalog's DataStream savepoint and the key ``user-3``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import statequery

root = Path(__file__).resolve().parent.parent
path = sys.argv[1] if len(sys.argv) > 1 else str(root / "catalog" / "user_activity")
key = sys.argv[2] if len(sys.argv) > 2 else "user-3"

sp = statequery.open(path)
meta = sp.state_meta()
print(f"{sp.location}: {len(sp.operators)} operators, {meta.num_rows} states")
for row in meta.select(["table_name", "kind", "key_type", "value_type"]).to_pylist():
    print(f"  {row['table_name']:<50} {row['kind']:<17} {row['key_type'] or '':<8} "
          f"{row['value_type'] or ''}")

print(f"\nEverything the savepoint holds for key {key!r}:")
for (operator, state), table in sp.lookup(key).items():
    print(f"\n{operator} / {state}")
    for row in table.to_pylist():
        print("  ", row)
