"""Where state is big or skewed: :func:`state_stats` (the ``state_stats`` table) and
:func:`skew_summary`.

One pass per key-group range (as a read): every keyed state of an operator is decoded once per
range, and per state and key group the pass counts

* ``entries``: rows as :meth:`Savepoint.read` returns them (one per value, list, map entry or
  timer), ``distinct_keys``,
* ``key_bytes`` / ``value_bytes``: the serialized composite key (key, namespace and, for map
  state, user key; for timers the timestamp too) and the serialized value, exactly as the
  snapshot stores them, without the key-group prefix and the length framing. Canonical savepoints
  and RocksDB snapshots store entries in this form; the heap layout of hashmap checkpoints and
  native savepoints does not, and its byte columns are null (``state_meta.size_bytes`` still
  gives the state's share of the files),
* ``largest_entry_bytes``.

The heaviest keys (by bytes, else entries) are kept in a bounded heap across ranges: a key lives
in one key group, so its figures are complete when its range is done. Operator state has one row
per subtask (``key_group`` null) with its entries and the bytes of its partition of the stream.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.jsonify import canonical_json, freeze, jsonify_column
from statequery.exceptions import NoSuchStateError
from statequery.hashing import split_key_groups
from statequery.metadata.model import _partition_bytes
from statequery.metadata.statemeta import OperatorInfo, StateInfo
from statequery.ranges import scan_states
from statequery.scan import read_table

if TYPE_CHECKING:
    from statequery.scan import StateSource

__all__ = [
    "HEAVIEST_KEYS_SCHEMA",
    "STATE_STATS_SCHEMA",
    "StateStats",
    "skew_summary",
    "state_stats",
    "subtask_of",
]

STATE_STATS_SCHEMA = pa.schema(
    [
        ("operator_id", pa.string()),
        ("operator", pa.string()),
        ("state", pa.string()),
        ("kind", pa.string()),
        ("subtask", pa.int32()),
        ("key_group", pa.int32()),
        ("entries", pa.int64()),
        ("distinct_keys", pa.int64()),
        ("key_bytes", pa.int64()),
        ("value_bytes", pa.int64()),
        ("bytes", pa.int64()),
        ("largest_entry_bytes", pa.int64()),
    ]
)

HEAVIEST_KEYS_SCHEMA = pa.schema(
    [
        ("operator_id", pa.string()),
        ("operator", pa.string()),
        ("state", pa.string()),
        ("key", pa.string()),
        ("key_group", pa.int32()),
        ("subtask", pa.int32()),
        ("entries", pa.int64()),
        ("bytes", pa.int64()),
    ]
)

DEFAULT_RANGE_SIZE = 32
DEFAULT_TOP = 10

Progress = Callable[[int], None]


def subtask_of(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns ``key_group`` (Flink's
    ``KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup``)."""
    return key_group * parallelism // max_parallelism


class _SizedBuilder(BatchBuilder):
    """A BatchBuilder that also receives each entry's serialized sizes (from
    :class:`~statequery.backends.keygroups.CompositeEntryDecoder`), one per row."""

    def __init__(self, schema: pa.Schema, layout: Any) -> None:
        super().__init__(schema, layout)
        self.sizes: list[tuple[int, int]] = []

    def on_entry_bytes(self, key_bytes: int, value_bytes: int) -> None:
        self.sizes.append((key_bytes, value_bytes))


@dataclass
class StateStats:
    """The result of :func:`state_stats`."""

    table: pa.Table
    heaviest_keys: pa.Table
    #: per (operator id, state name)
    max_parallelism: dict[tuple[str, str], int] = field(default_factory=dict)
    parallelism: dict[tuple[str, str], int] = field(default_factory=dict)

    def skew(self, parallelism: int | None = None) -> pa.Table:
        return skew_summary(self, parallelism)


class _Acc:
    """Per state: rows of the stats table and the heaviest keys."""

    def __init__(self, top: int) -> None:
        self.cols: dict[str, list[Any]] = {n: [] for n in STATE_STATS_SCHEMA.names}
        self.keys: list[tuple[int, int, int, dict[str, Any]]] = []
        self.top = top
        self.seq = 0

    def row(self, **values: Any) -> None:
        for n in STATE_STATS_SCHEMA.names:
            self.cols[n].append(values.get(n))

    def wants(self, weight: int) -> bool:
        return self.top > 0 and (len(self.keys) < self.top or weight > self.keys[0][0])

    def key(self, weight: int, doc: dict[str, Any]) -> None:
        if self.top <= 0:
            return
        self.seq += 1
        item = (weight, -self.seq, self.seq, doc)
        if len(self.keys) < self.top:
            heapq.heappush(self.keys, item)
        elif item > self.keys[0]:
            heapq.heapreplace(self.keys, item)


def _ranges(
    op: OperatorInfo, range_size: int, only: set[int] | None = None
) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for sub in op.subtasks:
        kgr = sub.key_groups
        if kgr is None:
            continue
        wanted = [g for g in range(kgr.start, kgr.end + 1) if only is None or g in only]
        out.extend((sub.index, groups) for groups in split_key_groups(wanted, range_size))
    return out


def key_group_tasks(
    sp: StateSource, operator: str | None = None, state: str | None = None,
    range_size: int = DEFAULT_RANGE_SIZE,
) -> list[tuple[str, list[int]]]:
    """``(operator id, key groups)`` of every range :func:`state_stats` walks: the tasks of a
    distributed computation."""
    ops = [sp.model.operator(operator)] if operator is not None else list(sp.model.operators)
    tasks: list[tuple[str, list[int]]] = []
    for op in ops:
        if any(s.keyed and s.decodable and (state is None or state in (s.name, s.table_name))
               for s in op.states):
            tasks.extend((op.operator_id, kgs) for _, kgs in _ranges(op, range_size))
    return tasks


def _scan_range(
    sp: StateSource, infos: list[StateInfo], key_groups: list[int]
) -> dict[str, tuple[pa.Table, list[tuple[int, int]] | None]]:

    builders = scan_states(sp, infos, key_groups, _SizedBuilder)
    out: dict[str, tuple[pa.Table, list[tuple[int, int]] | None]] = {}
    for name, builder in builders.items():
        assert isinstance(builder, _SizedBuilder)
        n_rows = len(builder)
        sizes = builder.sizes if len(builder.sizes) == n_rows else None
        batch = builder.flush()
        schema = builder.schema
        out[name] = (pa.Table.from_batches([batch] if batch is not None else [], schema=schema),
                     sizes)
    return out


def _keyed_stats(
    sp: StateSource,
    op: OperatorInfo,
    infos: list[StateInfo],
    accs: dict[str, _Acc],
    range_size: int,
    progress: Progress | None,
    only: set[int] | None = None,
) -> None:
    label = op.display_name
    for subtask, kgs in _ranges(op, range_size, only):
        results = _scan_range(sp, infos, kgs)
        for info in infos:
            table, sizes = results[info.name]
            acc = accs[info.name]
            kg_col = table.column("key_group").to_pylist()
            keys = [freeze(k) for k in table.column("key").to_pylist()]
            per_kg: dict[int, list[int]] = {}
            distinct: dict[int, set[Any]] = {}
            per_key: dict[Any, list[int]] = {}
            for i, kg in enumerate(kg_col):
                kb, vb = sizes[i] if sizes is not None else (0, 0)
                agg = per_kg.get(kg)
                if agg is None:
                    agg = per_kg[kg] = [0, 0, 0, 0]
                    distinct[kg] = set()
                agg[0] += 1
                agg[1] += kb
                agg[2] += vb
                if kb + vb > agg[3]:
                    agg[3] = kb + vb
                k = keys[i]
                distinct[kg].add(k)
                pk = per_key.get(k)
                if pk is None:
                    pk = per_key[k] = [kg, 0, 0, i]
                pk[1] += 1
                pk[2] += kb + vb
            for kg in sorted(per_kg):
                entries, kb, vb, largest = per_kg[kg]
                have = sizes is not None
                acc.row(
                    operator_id=op.operator_id, operator=label, state=info.name, kind=info.kind,
                    subtask=subtask, key_group=kg, entries=entries,
                    distinct_keys=len(distinct[kg]),
                    key_bytes=kb if have else None, value_bytes=vb if have else None,
                    bytes=kb + vb if have else None, largest_entry_bytes=largest if have else None,
                )
            key_col = table.column("key")
            for kg, entries, nbytes, first in per_key.values():
                weight = nbytes if sizes is not None else entries
                if not acc.wants(weight):
                    continue
                key_json = canonical_json(jsonify_column(key_col.slice(first, 1))[0])
                acc.key(
                    weight,
                    {"operator_id": op.operator_id, "operator": label, "state": info.name,
                     "key": key_json, "key_group": kg, "subtask": subtask, "entries": entries,
                     "bytes": nbytes if sizes is not None else None},
                )
        if progress is not None:
            progress(len(kgs))


def _operator_stats(sp: StateSource, op: OperatorInfo, info: StateInfo, acc: _Acc) -> None:
    table = read_table(sp.model, sp.context, info)
    subtasks = table.column("subtask").to_pylist() if "subtask" in table.column_names else []
    counts: dict[int, int] = {}
    for s in subtasks:
        counts[s] = counts.get(s, 0) + 1
    if info.kind == "broadcast":
        counts = {0: table.num_rows}
    for sub in op.subtasks:
        h = sub.operator_handle
        if h is None or sub.index not in counts:
            continue
        nbytes = _partition_bytes(h, info.name)
        acc.row(
            operator_id=op.operator_id, operator=op.display_name, state=info.name, kind=info.kind,
            subtask=sub.index, key_group=None, entries=counts[sub.index], distinct_keys=None,
            key_bytes=None, value_bytes=None, bytes=nbytes, largest_entry_bytes=None,
        )


def state_stats(
    sp: StateSource,
    operator: str | None = None,
    state: str | None = None,
    range_size: int = DEFAULT_RANGE_SIZE,
    top: int = DEFAULT_TOP,
    progress: Progress | None = None,
    key_groups: Iterable[int] | None = None,
    operator_state: bool = True,
) -> StateStats:
    """Entries, distinct keys and bytes per state and key group (see the module docs), and the
    ``top`` heaviest keys per state. ``operator`` (uid, name or id) and ``state`` (name or table
    name) restrict it; states that cannot be decoded are left out. ``key_groups`` restricts keyed
    state to those key groups, ``operator_state=False`` leaves operator state out (how Spark
    splits the work)."""
    only = None if key_groups is None else {int(k) for k in key_groups}
    ops = [sp.model.operator(operator)] if operator is not None else list(sp.model.operators)
    if state is not None and not any(state in (s.name, s.table_name)
                                     for op in ops for s in op.states):
        names = sorted({s.table_name or s.name for op in ops for s in op.states})
        raise NoSuchStateError(
            f"no state {state!r}" + (f" in operator {operator!r}" if operator else "")
            + f" in {sp.model.location} (states: {', '.join(names) or 'none'})"
        )
    accs: dict[tuple[str, str], _Acc] = {}
    maxp: dict[tuple[str, str], int] = {}
    par: dict[tuple[str, str], int] = {}
    for op in ops:
        infos = [
            s for s in op.states
            if s.decodable and (state is None or state in (s.name, s.table_name))
        ]
        if not infos:
            continue
        op_accs = {s.name: _Acc(top) for s in infos}
        keyed = [s for s in infos if s.keyed]
        if keyed:
            _keyed_stats(sp, op, keyed, op_accs, range_size, progress, only)
        for s in infos:
            if not s.keyed and operator_state:
                _operator_stats(sp, op, s, op_accs[s.name])
                if progress is not None:
                    progress(1)
            accs[(op.operator_id, s.name)] = op_accs[s.name]
            maxp[(op.operator_id, s.name)] = s.max_parallelism
            par[(op.operator_id, s.name)] = s.parallelism
    cols: dict[str, list[Any]] = {n: [] for n in STATE_STATS_SCHEMA.names}
    key_rows: list[dict[str, Any]] = []
    for acc in accs.values():
        for n in STATE_STATS_SCHEMA.names:
            cols[n].extend(acc.cols[n])
        key_rows.extend(doc for *_, doc in sorted(acc.keys, reverse=True))
    return StateStats(
        pa.Table.from_pydict(cols, schema=STATE_STATS_SCHEMA),
        pa.Table.from_pylist(key_rows, schema=HEAVIEST_KEYS_SCHEMA),
        maxp,
        par,
    )


def stats_work(sp: StateSource, operator: str | None = None, state: str | None = None) -> int:
    """Units of work :func:`state_stats` reports to ``progress``."""
    ops = [sp.model.operator(operator)] if operator is not None else list(sp.model.operators)
    total = 0
    for op in ops:
        infos = [s for s in op.states if s.decodable and (state is None or state in
                                                          (s.name, s.table_name))]
        if any(s.keyed for s in infos):
            total += op.max_parallelism
        total += sum(1 for s in infos if not s.keyed)
    return total


def skew_summary(stats: StateStats, parallelism: int | None = None) -> pa.Table:
    """Per keyed state: totals, the heaviest key group and key, and how the key groups' bytes
    (entries where bytes are unknown) spread over the subtasks at the snapshot's parallelism and
    at ``parallelism`` (``max_over_mean``: 1.0 is perfectly even)."""
    t = stats.table
    rows: list[dict[str, Any]] = []
    by_state: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in t.to_pylist():
        if r["key_group"] is not None:
            by_state.setdefault((r["operator_id"], r["state"]), []).append(r)
    heavy: dict[tuple[str, str], dict[str, Any]] = {}
    for r in stats.heaviest_keys.to_pylist():
        heavy.setdefault((r["operator_id"], r["state"]), r)

    def spread(weights: dict[int, int], maxp: int, par: int) -> tuple[list[int], float | None]:
        per = [0] * par
        for kg, w in weights.items():
            per[subtask_of(kg, maxp, par)] += w
        mean = sum(per) / par if par else 0
        return per, (max(per) / mean if mean else None)

    for (op_id, name), rs in by_state.items():
        maxp = stats.max_parallelism[(op_id, name)]
        par = stats.parallelism[(op_id, name)]
        use_bytes = all(r["bytes"] is not None for r in rs)
        weights = {r["key_group"]: (r["bytes"] if use_bytes else r["entries"]) for r in rs}
        top_kg = max(weights, key=lambda k: (weights[k], -k))
        total_w = sum(weights.values())
        per_now, ratio_now = spread(weights, maxp, par)
        doc: dict[str, Any] = {
            "operator_id": op_id,
            "operator": rs[0]["operator"],
            "state": name,
            "weight": "bytes" if use_bytes else "entries",
            "entries": sum(r["entries"] for r in rs),
            "distinct_keys": sum(r["distinct_keys"] for r in rs),
            "bytes": sum(r["bytes"] for r in rs) if use_bytes else None,
            "key_groups_with_data": len(rs),
            "heaviest_key_group": top_kg,
            "heaviest_key_group_share": weights[top_kg] / total_w if total_w else None,
            "heaviest_key": (heavy.get((op_id, name)) or {}).get("key"),
            "parallelism": par,
            "per_subtask": per_now,
            "max_over_mean": ratio_now,
            "at_parallelism": parallelism,
            "per_subtask_at": None,
            "max_over_mean_at": None,
        }
        if parallelism is not None:
            per_at, ratio_at = spread(weights, maxp, parallelism)
            doc["per_subtask_at"] = per_at
            doc["max_over_mean_at"] = ratio_at
        rows.append(doc)
    return pa.Table.from_pylist(rows, schema=SKEW_SCHEMA)


SKEW_SCHEMA = pa.schema(
    [
        ("operator_id", pa.string()),
        ("operator", pa.string()),
        ("state", pa.string()),
        ("weight", pa.string()),
        ("entries", pa.int64()),
        ("distinct_keys", pa.int64()),
        ("bytes", pa.int64()),
        ("key_groups_with_data", pa.int32()),
        ("heaviest_key_group", pa.int32()),
        ("heaviest_key_group_share", pa.float64()),
        ("heaviest_key", pa.string()),
        ("parallelism", pa.int32()),
        ("per_subtask", pa.list_(pa.int64())),
        ("max_over_mean", pa.float64()),
        ("at_parallelism", pa.int32()),
        ("per_subtask_at", pa.list_(pa.int64())),
        ("max_over_mean_at", pa.float64()),
    ]
)
