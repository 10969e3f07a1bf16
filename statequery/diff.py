"""What changed between two savepoints or checkpoints: :func:`diff_batches` / :func:`diff_table`.

Operators are paired by OperatorID (a uid hashes to it, as Flink resolves ``uid``), states by
name. A paired keyed state is compared **key-group range by key-group range**: both sides read
only the key groups of one range (``range_size`` key groups at a time), so memory is bounded by
one range, and the work is the same as two reads. Entries are identified as in Flink's state:

=====================  ==========================================
kind                   identity
=====================  ==========================================
value, list,           ``key, namespace``
reducing, aggregating
map                    ``key, namespace, user_key``
timers                 ``key, namespace, timestamp``
operator list/union    ``subtask, index``
broadcast              ``user_key``
=====================  ==========================================

One row per entry that was ``added``, ``removed`` or ``changed``. Rows of different states share
one table, so keys and values are JSON text in the fixture entry format
(:mod:`statequery.arrow.jsonify`); TTL values are ``{"value": v, "last_access": ms}``. A state
whose kind or types differ between the two sides is one ``schema_changed`` row (old and new type
in ``old_value``/``new_value``) and its entries are not compared; a state that cannot be decoded
on either side is one ``not_compared`` row with the reason. The two sides may be of any format and
backend (a canonical savepoint against a RocksDB incremental checkpoint of the same job).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from statequery.arrow.jsonify import EPOCH_MS_COLUMNS, canonical_json, freeze, jsonify_column
from statequery.exceptions import InvalidOptionError, NoSuchOperatorError, NoSuchStateError
from statequery.hashing import split_key_groups
from statequery.metadata.statemeta import OperatorInfo, StateInfo, type_string
from statequery.ranges import read_states
from statequery.scan import read_table, state_key_group

if TYPE_CHECKING:
    from statequery.scan import StateSource

__all__ = [
    "CHANGE_KINDS",
    "DIFF_SCHEMA",
    "diff_batches",
    "diff_table",
    "entry_fields",
    "state_pairs",
]

#: The ``change`` column's values.
CHANGE_KINDS = ("added", "removed", "changed", "schema_changed", "not_compared")

DIFF_SCHEMA = pa.schema(
    [
        ("operator_id", pa.string()),
        ("operator", pa.string()),
        ("state", pa.string()),
        ("kind", pa.string()),
        ("change", pa.string()),
        ("key_group", pa.int32()),
        ("key", pa.string()),
        ("namespace", pa.string()),
        ("user_key", pa.string()),
        ("timestamp", pa.int64()),
        ("subtask", pa.int32()),
        ("index", pa.int32()),
        ("old_value", pa.string()),
        ("new_value", pa.string()),
    ]
)

DEFAULT_RANGE_SIZE = 32

Progress = Callable[[int], None]


class PartialReader(Protocol):
    """Reads, of one key-group range of an operator's keyed states, only the entries that can
    differ between the two sides, or None to read the range whole
    (:class:`statequery.incdiff.IncrementalDiff`)."""

    def read(
        self, operator_id: str, olds: list[StateInfo], news: list[StateInfo],
        key_groups: Sequence[int],
    ) -> tuple[dict[str, pa.Table], dict[str, pa.Table]] | None: ...


@dataclass(frozen=True)
class StatePair:
    """One state of one operator on both sides (either may be missing)."""

    operator_id: str
    operator: str
    name: str
    old: StateInfo | None
    new: StateInfo | None

    @property
    def kind(self) -> str:
        return (self.new or self.old).kind  # type: ignore[union-attr]


def _find_operator(sp: StateSource, ident: str) -> OperatorInfo | None:
    try:
        return sp.model.operator(ident)
    except NoSuchOperatorError:
        return None


def state_pairs(
    old: StateSource, new: StateSource, operator: str | None = None, state: str | None = None
) -> list[StatePair]:
    """The states of both sides paired by operator id and state name, filtered by ``operator``
    (uid, name or id) and ``state`` (state name, or a table name when ``operator`` is None)."""
    if operator is not None:
        o, n = _find_operator(old, operator), _find_operator(new, operator)
        if o is None and n is None:
            raise NoSuchOperatorError(
                f"no operator {operator!r} in {old.model.location} or {new.model.location}"
            )
        ops_old = [o] if o is not None else []
        ops_new = [n] if n is not None else []
    else:
        ops_old, ops_new = list(old.model.operators), list(new.model.operators)
    by_id: dict[str, tuple[OperatorInfo | None, OperatorInfo | None]] = {}
    for op in ops_old:
        by_id[op.operator_id] = (op, None)
    for op in ops_new:
        by_id[op.operator_id] = (by_id.get(op.operator_id, (None, None))[0], op)
    pairs = []
    for op_id, (o, n) in by_id.items():
        label = (n or o).display_name  # type: ignore[union-attr]
        olds = {s.name: s for s in (o.states if o else ())}
        news = {s.name: s for s in (n.states if n else ())}
        for name in list(olds) + [x for x in news if x not in olds]:
            so, sn = olds.get(name), news.get(name)
            if state is not None:
                tables = {x.table_name for x in (so, sn) if x is not None}
                if name != state and state not in tables:
                    continue
            pairs.append(StatePair(op_id, label, name, so, sn))
    if state is not None and not pairs:
        raise NoSuchStateError(
            f"no state {state!r}"
            + (f" in operator {operator!r}" if operator else "")
            + f" in {old.model.location} or {new.model.location}"
        )
    return pairs


def _schema_of(s: StateInfo) -> str:
    parts = [s.kind]
    for label, spec in (
        ("key", s.key_spec),
        ("namespace", s.namespace_spec),
        ("user_key", s.user_key_spec),
        ("value", s.value_spec),
    ):
        if spec is not None:
            parts.append(f"{label} {type_string(spec)}")
    if s.ttl:
        parts.append("ttl")
    return ", ".join(parts)


# -- entries of one read, keyed by identity --------------------------------------------------


_TIMERS = ("event_timer", "processing_timer")


class _Entry:
    """One row of one side, compared on its decoded values; turned into JSON text only when it
    is reported (most entries of a diff are equal)."""

    __slots__ = ("_json", "i", "kind", "table", "value")

    def __init__(self, table: pa.Table, i: int, kind: str, value: Any) -> None:
        self.table = table
        self.i = i
        self.kind = kind
        self.value = value
        self._json: dict[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        if self._json is None:
            row = self.table.slice(self.i, 1)
            cols = {
                name: jsonify_column(row.column(name), epoch_ms=name in EPOCH_MS_COLUMNS)[0]
                for name in row.column_names
                if not name.endswith("_reason")
            }
            value = cols.get("value")
            la = cols.get("last_access")
            if la is not None and value is not None:
                if self.kind == "list":
                    value = [{"value": v, "last_access": t} for v, t in zip(value, la, strict=True)]
                else:
                    value = {"value": value, "last_access": la}
            out: dict[str, Any] = {
                "key_group": cols.get("key_group"),
                "key": canonical_json(cols["key"]) if "key" in cols else None,
                "namespace": canonical_json(cols["namespace"]) if "key" in cols else None,
                "user_key": canonical_json(cols["user_key"]) if "user_key" in cols else None,
                "timestamp": cols.get("timestamp_ms", cols.get("timestamp")),
                "subtask": cols.get("subtask"),
                "index": cols.get("index"),
                "value": None if self.kind in _TIMERS else canonical_json(value),
            }
            self._json = out
        return self._json


def entry_fields(table: pa.Table, kind: str) -> list[dict[str, Any]]:
    """The entries of one state's read as diff reports them: ``key_group``, ``key``,
    ``namespace``, ``user_key``, ``timestamp``, ``subtask``, ``index`` and ``value``, keys and
    values as JSON text (what :mod:`statequery.history` shows for one key through time)."""
    return [e.fields() for e in _entries(table, kind).values()]


def _frozen(column: pa.ChunkedArray) -> list[Any]:
    """The column's Python values, hashable (nested values frozen)."""
    values: list[Any] = column.to_pylist()
    t = column.type
    if pa.types.is_nested(t) or pa.types.is_floating(t):
        return [freeze(v) for v in values]
    return values


def _entries(table: pa.Table, kind: str) -> dict[tuple[Any, ...], _Entry]:
    names = [n for n in table.column_names if not n.endswith("_reason")]
    n = table.num_rows
    cols = {name: _frozen(table.column(name)) for name in names}
    none = [None] * n

    def col(name: str) -> list[Any]:
        return cols.get(name) or none

    key, ns, uk, ts = col("key"), col("namespace"), col("user_key"), col("timestamp_ms")
    if "timestamp_ms" not in cols:
        ts = col("timestamp")
    sub, idx, val, la = col("subtask"), col("index"), col("value"), cols.get("last_access")
    out: dict[tuple[Any, ...], _Entry] = {}
    for i in range(n):
        if kind in ("operator_list", "operator_union"):
            ident: tuple[Any, ...] = (sub[i], idx[i])
        elif kind == "broadcast":
            ident = (uk[i],)
        else:
            ident = (key[i], ns[i], uk[i], ts[i])
        value = None
        if kind not in _TIMERS:
            value = (val[i], la[i]) if la is not None else val[i]
        out[ident] = _Entry(table, i, kind, value)
    return out


class _Rows:
    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in DIFF_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.cols["change"])

    def add(self, pair: StatePair, change: str, e: _Entry | None, old: Any, new: Any) -> None:
        c = self.cols
        c["operator_id"].append(pair.operator_id)
        c["operator"].append(pair.operator)
        c["state"].append(pair.name)
        c["kind"].append(pair.kind)
        c["change"].append(change)
        f = e.fields() if e is not None else {}
        for name in ("key_group", "key", "namespace", "user_key", "timestamp", "subtask", "index"):
            c[name].append(f.get(name))
        c["old_value"].append(old)
        c["new_value"].append(new)

    def flush(self) -> pa.RecordBatch | None:
        if not len(self):
            return None
        batch = pa.RecordBatch.from_pydict(self.cols, schema=DIFF_SCHEMA)
        self.cols = {name: [] for name in DIFF_SCHEMA.names}
        return batch


def _compare(
    pair: StatePair,
    old: dict[tuple[Any, ...], _Entry],
    new: dict[tuple[Any, ...], _Entry],
    rows: _Rows,
) -> None:
    def order(ident: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple("" if x is None else str(x) for x in ident)

    changed = []
    for ident, before in old.items():
        after = new.get(ident)
        if after is None or after.value != before.value:
            changed.append(ident)
    changed.extend(ident for ident in new if ident not in old)
    for ident in sorted(changed, key=order):
        o, n = old.get(ident), new.get(ident)
        if o is None and n is not None:
            rows.add(pair, "added", n, None, n.fields()["value"])
        elif n is None and o is not None:
            rows.add(pair, "removed", o, o.fields()["value"], None)
        elif o is not None and n is not None:
            rows.add(pair, "changed", n, o.fields()["value"], n.fields()["value"])


def _read(sp: StateSource, info: StateInfo | None, **kw: Any) -> pa.Table | None:
    if info is None:
        return None
    return read_table(sp.model, sp.context, info, **kw)


def diff_batches(
    old: StateSource,
    new: StateSource,
    operator: str | None = None,
    state: str | None = None,
    key: Any = None,
    range_size: int = DEFAULT_RANGE_SIZE,
    progress: Progress | None = None,
    key_groups: Iterable[int] | None = None,
    operator_state: bool = True,
    unchanged: Mapping[str, Iterable[int]] | None = None,
    partial: PartialReader | None = None,
) -> Iterator[pa.RecordBatch]:
    """The differences between ``old`` and ``new`` as RecordBatches of :data:`DIFF_SCHEMA`.

    ``operator`` (uid, name or id) and ``state`` (name or table name) restrict the comparison;
    ``key`` compares only that key's entries (only its key group is read). ``progress`` is called
    with the number of key groups (or operator states) done after each range. ``key_groups``
    restricts keyed state to those key groups and ``operator_state=False`` leaves operator state
    (and the schema rows) out: how Spark splits one diff into tasks. ``unchanged`` maps an
    operator id to key groups known to hold the same entries on both sides (an incremental
    checkpoint's subtask whose RocksDB files are the same: :mod:`statequery.history`); they
    are not read. ``partial`` (:class:`statequery.incdiff.IncrementalDiff`) may read a range's
    entries that can differ instead of all of them (not with ``key``).
    """
    if range_size <= 0:
        raise InvalidOptionError(f"range_size must be positive, got {range_size}")
    rows = _Rows()
    keyed: dict[str, list[StatePair]] = {}
    only = None if key_groups is None else {int(k) for k in key_groups}
    for pair in state_pairs(old, new, operator, state):
        o, n = pair.old, pair.new
        if o is not None and n is not None and _schema_of(o) != _schema_of(n):
            if operator_state:
                rows.add(pair, "schema_changed", None, _schema_of(o), _schema_of(n))
            continue
        if any(s is not None and not s.decodable for s in (o, n)):
            reasons = [None if s is None or s.decodable else s.reason for s in (o, n)]
            if operator_state:
                rows.add(pair, "not_compared", None, reasons[0], reasons[1])
            continue
        if (n or o).keyed:  # type: ignore[union-attr]
            keyed.setdefault(pair.operator_id, []).append(pair)
            continue
        if key is not None or not operator_state:
            continue  # operator state has no keys
        ot = _read(old, o)
        nt = _read(new, n)
        _compare(
            pair,
            _entries(ot, pair.kind) if ot is not None else {},
            _entries(nt, pair.kind) if nt is not None else {},
            rows,
        )
        if progress is not None:
            progress(1)
    batch = rows.flush()
    if batch is not None:
        yield batch
    for op_id, pairs in keyed.items():
        same = None if unchanged is None else unchanged.get(op_id)
        yield from _diff_keyed_operator(
            old, new, pairs, key, range_size, rows, progress, only,
            None if same is None else {int(k) for k in same},
            None if key is not None else partial,
        )
    batch = rows.flush()
    if batch is not None:
        yield batch


def _read_states(
    sp: StateSource, infos: list[StateInfo], key_groups: list[int] | None, key: Any
) -> dict[str, pa.Table]:
    return read_states(sp, infos, key_groups, key)


def _ranges_of(
    sides: list[tuple[StateSource, StateInfo]], max_parallelism: int, range_size: int,
    wanted: set[int] | None,
) -> list[list[int]]:
    """Key-group ranges: cut where a subtask's range starts on either side, then at most
    ``range_size`` key groups each."""
    cuts = {0, max_parallelism}
    for sp, s in sides:
        for sub in sp.model.operator(s.operator_id).subtasks:
            if sub.key_groups is not None:
                cuts.add(sub.key_groups.start)
                cuts.add(sub.key_groups.end + 1)
    bounds = sorted(c for c in cuts if 0 <= c <= max_parallelism)
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        groups = [g for g in range(a, b) if wanted is None or g in wanted]
        out.extend(split_key_groups(groups, range_size))
    return out


def _diff_keyed_operator(
    old: StateSource,
    new: StateSource,
    pairs: list[StatePair],
    key: Any,
    range_size: int,
    rows: _Rows,
    progress: Progress | None,
    only: set[int] | None = None,
    same: set[int] | None = None,
    partial: PartialReader | None = None,
) -> Iterator[pa.RecordBatch]:
    """The keyed states of one operator, range by range (all states of a range in one pass);
    the key groups in ``same`` are skipped."""
    olds = [p.old for p in pairs if p.old is not None]
    news = [p.new for p in pairs if p.new is not None]
    sides = [(old, s) for s in olds[:1]] + [(new, s) for s in news[:1]]
    maxps = {s.max_parallelism for _, s in sides}
    wanted: set[int] | None = None
    if key is not None:
        wanted = {state_key_group(s, key) for _, s in sides}
    if only is not None:
        wanted = only if wanted is None else wanted & only
    ranges: list[list[int] | None]
    if len(maxps) > 1 and only is not None:
        raise InvalidOptionError(
            "key_groups: the two sides have different max parallelism, their key groups differ"
        )
    if len(maxps) > 1:
        # key groups of different max parallelism do not line up: one range holds everything
        ranges = [None]
    else:
        maxp = maxps.pop()
        if same:
            wanted = (set(range(maxp)) if wanted is None else wanted) - same
            if progress is not None:
                progress(len(same) * len(pairs))
        ranges = list(_ranges_of(sides, maxp, range_size, wanted))
    for kgs in ranges:
        got = None if partial is None or kgs is None else partial.read(
            pairs[0].operator_id, olds, news, kgs)
        ot, nt = got if got is not None else (_read_states(old, olds, kgs, key),
                                              _read_states(new, news, kgs, key))
        for pair in pairs:
            o = ot.get(pair.name)
            n = nt.get(pair.name)
            _compare(
                pair,
                _entries(o, pair.kind) if o is not None else {},
                _entries(n, pair.kind) if n is not None else {},
                rows,
            )
        if progress is not None:
            progress((len(kgs) if kgs is not None else 1) * len(pairs))
        batch = rows.flush()
        if batch is not None:
            yield batch


def diff_table(
    old: StateSource,
    new: StateSource,
    operator: str | None = None,
    state: str | None = None,
    key: Any = None,
    range_size: int = DEFAULT_RANGE_SIZE,
) -> pa.Table:
    """:func:`diff_batches` collected into one Table."""
    batches = list(diff_batches(old, new, operator, state, key, range_size))
    return pa.Table.from_batches(batches, schema=DIFF_SCHEMA)


def key_group_ranges(
    old: StateSource, new: StateSource, pairs: Iterable[StatePair], range_size: int
) -> list[list[int]] | None:
    """The key-group ranges a diff of ``pairs`` walks (None when the two sides' max parallelism
    differ and everything is one range): the tasks of a distributed diff."""
    keyed = [p for p in pairs if (p.new or p.old) is not None and (p.new or p.old).keyed]  # type: ignore[union-attr]
    maxps = {s.max_parallelism for p in keyed for s in (p.old, p.new) if s is not None}
    if not maxps:
        return []
    if len(maxps) > 1:
        return None
    maxp = maxps.pop()
    sides = [(sp, s) for p in keyed for sp, s in ((old, p.old), (new, p.new)) if s is not None]
    return _ranges_of(sides, maxp, range_size, None)


def diff_work(old: StateSource, new: StateSource, pairs: Iterable[StatePair]) -> int:
    """Units of work :func:`diff_batches` reports to ``progress`` (for a progress bar)."""
    total = 0
    for p in pairs:
        s = p.new or p.old
        if s is None:
            continue
        total += s.max_parallelism if s.keyed else 1
    return total
