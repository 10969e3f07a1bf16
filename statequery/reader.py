"""Reading state as Arrow: :func:`read_state` (RecordBatches of one state) and :func:`lookup`
(everything every state holds for one key, reading only the key group that can hold it).

Keyed state is read per subtask handle through a :class:`~statequery.backends.KeyedBackend`
chosen by the handle's layout (canonical savepoint, hashmap checkpoint, and RocksDB native via a
registered factory), restricted to the requested key groups. Operator state is read from each
subtask's operator state stream (:mod:`statequery.backends.operator`).

``savepoint`` is a :class:`statequery.savepoint.Savepoint` (or anything with ``metadata``,
``resolver`` and ``io``); a path is opened with :func:`statequery.open`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statequery.arrow.batches import BatchBuilder, split_batch
from statequery.arrow.schemas import StateLayout, layout_from_meta, resolve_mode, state_schema
from statequery.backends import KeyedBackend, KeyedContext, keyed_backend_for
from statequery.decoder import Decoder
from statequery.exceptions import (
    InvalidOptionError,
    NoSuchOperatorError,
    NoSuchStateError,
    UnsupportedFormatError,
)
from statequery.serializers.spec import RowDataSpec, RowSpec, SerializerSpec, TupleSpec

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "StateRef",
    "key_group_of_key",
    "list_states",
    "lookup",
    "read_state",
    "read_table",
    "schema_of",
]

DEFAULT_BATCH_SIZE = 65536


# -- savepoint access ------------------------------------------------------------------------------


def _as_savepoint(savepoint: Any) -> Any:
    if isinstance(savepoint, str):
        import statequery

        return statequery.open(savepoint)
    return savepoint


def _metadata(sp: Any) -> Any:
    md = getattr(sp, "metadata", None)
    if md is None:
        raise TypeError(f"not a savepoint: {sp!r}")
    return md


def _resolver(sp: Any) -> Any:
    r = getattr(sp, "resolver", None)
    if r is not None:
        return r
    from statequery.io import location_parent
    from statequery.metadata.handles import HandleResolver

    cache = _cache(sp)
    cached = cache.get("resolver")
    if cached is None:
        loc = _metadata(sp).location
        directory = location_parent(loc) if loc.rstrip("/").endswith("_metadata") else loc
        cached = cache["resolver"] = HandleResolver(sp.io, directory)
    return cached


def _is_state_info(obj: Any) -> bool:
    """A ``StateInfo`` of the metadata layer (names one operator's state)."""
    return (
        hasattr(obj, "operator_id")
        and hasattr(obj, "kind")
        and hasattr(obj, "name")
        and not hasattr(obj, "subtasks")
    )


def _operator(sp: Any, operator: Any) -> Any:
    """The ``_metadata`` ``OperatorState`` named by uid, name or id (or given as a record)."""
    ops = _metadata(sp).operators
    if hasattr(operator, "operator_id"):
        ident = operator.operator_id
        for op in ops:
            if op.operator_id == ident:
                return op
    ident = str(operator)
    finder = getattr(sp, "operator", None)
    if callable(finder):
        found = finder(ident)  # uid, operator id, name or uid hash, as Savepoint resolves them
        for op in ops:
            if op.operator_id == found.operator_id:
                return op
    for attr in ("uid", "operator_id", "name"):
        matches = [op for op in ops if getattr(op, attr, None) and getattr(op, attr) == ident]
        if len(matches) == 1:
            return matches[0]
    from statequery.hashing import operator_id_from_uid

    hashed = operator_id_from_uid(ident)
    for op in ops:
        if op.operator_id == hashed:
            return op
    raise NoSuchOperatorError(
        f"no operator {ident!r}; operators: "
        + ", ".join(op.uid or op.name or op.operator_id for op in ops)
    )


def _op_label(op: Any) -> str:
    return str(op.uid or op.name or op.operator_id)


# -- per-savepoint caches (parsed headers are reused by every read) ------------------------------

_LOCK = threading.Lock()
_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()


def _cache(sp: Any) -> dict[Any, Any]:
    """Per-savepoint cache of opened backends (weakly keyed; an attribute as a fallback)."""
    with _LOCK:
        try:
            c = _CACHE.get(sp)
            if c is None:
                c = _CACHE[sp] = {}
            return c
        except TypeError:  # not weak-referenceable
            c = getattr(sp, "_statequery_reader_cache", None)
            if c is None:
                c = {}
                try:
                    sp._statequery_reader_cache = c
                except (AttributeError, TypeError):
                    pass
            return c


def _keyed_backends(sp: Any, op: Any) -> list[tuple[int, KeyedBackend]]:
    """``(subtask index, backend)`` for every subtask of ``op`` with managed keyed state."""
    cache = _cache(sp)
    ck = ("keyed", op.operator_id)
    hit = cache.get(ck)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    context = KeyedContext(_resolver(sp), op.max_parallelism, _op_label(op))
    out = []
    for st in op.subtasks:
        handle = st.managed_keyed
        if handle is None:
            continue
        out.append((st.index, keyed_backend_for(handle, context)))
    out.sort(key=lambda t: t[0])
    cache[ck] = out
    return out


@dataclass
class _OperatorStream:
    subtask: int
    handle: Any
    stream: Any
    proxy: Any
    layouts: dict[str, StateLayout]
    all_offsets: tuple[int, ...]


def _operator_streams(sp: Any, op: Any) -> list[_OperatorStream]:
    cache = _cache(sp)
    ck = ("operator", op.operator_id)
    hit = cache.get(ck)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    from statequery.backends import HandleStream
    from statequery.metadata.proxy import read_operator_proxy

    resolver = _resolver(sp)
    out = []
    for st in sorted(op.subtasks, key=lambda s: s.index):
        handle = st.managed_operator
        if handle is None:
            continue
        all_offsets = tuple(o for p in handle.partitions for o in p.offsets)
        if not all_offsets:
            continue
        stream = HandleStream(resolver, handle.delegate)
        data = stream.read_range(0, min(all_offsets))
        proxy = read_operator_proxy(Decoder(data, source=stream.name))
        layouts: dict[str, StateLayout] = {}
        for meta in _operator_proxy_states(proxy):
            try:
                layouts[meta.name] = layout_from_meta(meta)
            except UnsupportedFormatError:
                continue
        out.append(_OperatorStream(st.index, handle, stream, proxy, layouts, all_offsets))
    cache[ck] = out
    return out


def _operator_proxy_states(proxy: Any) -> list[Any]:
    states = list(getattr(proxy, "states", ()) or ())
    for attr in ("operator_states", "broadcast_states"):
        for meta in getattr(proxy, attr, ()) or ():
            if meta not in states:
                states.append(meta)
    return states


# -- state discovery -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateRef:
    """One readable state of an operator."""

    operator: str
    operator_id: str
    state: str
    layout: StateLayout
    max_parallelism: int


def list_states(savepoint: Any, operator: Any) -> list[StateRef]:
    """Every keyed and operator state of ``operator`` (from the state headers)."""
    sp = _as_savepoint(savepoint)
    op = _operator(sp, operator)
    seen: dict[str, StateRef] = {}
    for _, backend in _keyed_backends(sp, op):
        for name, layout in backend.layouts.items():
            if name not in seen and layout.keyed:
                seen[name] = StateRef(
                    _op_label(op), op.operator_id, name, layout, op.max_parallelism
                )
    for os_ in _operator_streams(sp, op):
        for p in os_.handle.partitions:
            op_layout = os_.layouts.get(p.name)
            if op_layout is not None and p.name not in seen:
                seen[p.name] = StateRef(
                    _op_label(op), op.operator_id, p.name, op_layout, op.max_parallelism
                )
    return list(seen.values())


def _state_layout(sp: Any, op: Any, state: str) -> StateLayout:
    for _, backend in _keyed_backends(sp, op):
        layout = backend.layouts.get(state)
        if layout is not None:
            if not layout.keyed:
                errors = getattr(backend, "errors", {})
                raise UnsupportedFormatError(
                    errors.get(state, f"state {state!r} ({layout.kind}) is not readable as rows")
                )
            return layout
    for os_ in _operator_streams(sp, op):
        layout = os_.layouts.get(state)
        if layout is not None:
            return layout
    names = sorted({s.state for s in list_states(sp, op)})
    raise NoSuchStateError(
        f"operator {_op_label(op)!r} has no state {state!r}; states: {', '.join(names) or 'none'}"
    )


def schema_of(savepoint: Any, operator: Any, state: str, mode: str | None = None) -> pa.Schema:
    """The Arrow schema :func:`read_state` produces for this state and mode."""
    sp = _as_savepoint(savepoint)
    op = _operator(sp, operator)
    return state_schema(_state_layout(sp, op, state), mode)


# -- keys ------------------------------------------------------------------------------------------


def _normalize_key(key: Any, spec: SerializerSpec | None) -> Any:
    """The user's key in the form the readers return (dicts for rows and tuples)."""
    if isinstance(spec, RowDataSpec):
        names = [f.name or f"f{i}" for i, f in enumerate(spec.type.fields)]
        return _as_fields(key, names)
    if isinstance(spec, RowSpec):
        return _as_fields(key, list(spec.field_names))
    if isinstance(spec, TupleSpec):
        return _as_fields(key, [f"f{i}" for i in range(len(spec.fields))])
    return key


def _as_fields(key: Any, names: list[str]) -> Any:
    if isinstance(key, dict):
        return key
    if isinstance(key, (tuple, list)):
        if len(key) != len(names):
            raise InvalidOptionError(
                f"key {key!r} has {len(key)} fields, the key type {len(names)}"
            )
        return dict(zip(names, key, strict=True))
    if len(names) == 1:
        return {names[0]: key}
    raise InvalidOptionError(f"key {key!r} needs {len(names)} fields")


def key_group_of_key(
    key: Any, key_serializer: SerializerSpec | None, max_parallelism: int
) -> int | None:
    """The key group Flink assigns ``key`` to; None when it cannot be computed (POJO keys)."""
    from statequery.hashing import key_group_of

    try:
        return key_group_of(key, max_parallelism, key_serializer)
    except UnsupportedFormatError:
        return None


# -- reading ---------------------------------------------------------------------------------------


def _key_group_set(key_groups: Iterable[Any]) -> set[int]:
    try:
        return {int(k) for k in key_groups}
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"key_groups must be integers: {e}") from None


def read_state(
    savepoint: Any,
    operator: Any,
    state: str | None = None,
    key: Any = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Iterator[pa.RecordBatch]:
    """The rows of one state as RecordBatches of at most ``batch_size`` rows.

    ``key`` restricts keyed state to one key (only its key group is read); ``key_groups`` to a set
    of key groups. ``mode``: ``rows`` (default), ``flat`` (list elements one per row) or
    ``nested`` (one map per key for map state). See :mod:`statequery.arrow.schemas` for columns.
    """
    if batch_size <= 0:
        raise InvalidOptionError(f"batch_size must be positive, got {batch_size}")
    sp = _as_savepoint(savepoint)
    if state is None:
        if not _is_state_info(operator):
            raise InvalidOptionError("read_state needs a state name (or a StateInfo)")
        state = operator.name
    op = _operator(sp, operator)
    layout = _state_layout(sp, op, state)
    resolve_mode(layout, mode)
    # the checks above run now; the bytes are read as the batches are consumed
    if layout.keyed:
        return _read_keyed(sp, op, layout, key, key_groups, mode, batch_size)
    if key is not None or key_groups is not None:
        raise InvalidOptionError(f"state {state!r} is operator state: it has no keys")
    return _read_operator(sp, op, layout, batch_size)


def read_table(
    savepoint: Any,
    operator: Any,
    state: str | None = None,
    key: Any = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
) -> pa.Table:
    """:func:`read_state` collected into one Table."""
    sp = _as_savepoint(savepoint)
    if state is None and _is_state_info(operator):
        state = operator.name
    if state is None:
        raise InvalidOptionError("read_table needs a state name (or a StateInfo)")
    op = _operator(sp, operator)
    schema = state_schema(_state_layout(sp, op, state), mode)
    batches = list(read_state(sp, op, state, key, key_groups, mode))
    return pa.Table.from_batches(batches, schema=schema)


def _read_keyed(
    sp: Any,
    op: Any,
    layout: StateLayout,
    key: Any,
    key_groups: Iterable[int] | None,
    mode: str | None,
    batch_size: int,
) -> Iterator[pa.RecordBatch]:
    schema = state_schema(layout, mode)
    builder = BatchBuilder(schema, layout)
    wanted: set[int] | None = None if key_groups is None else _key_group_set(key_groups)
    wanted_key: Any = None
    if key is not None:
        wanted_key = _normalize_key(key, layout.key)
        kg = key_group_of_key(key, layout.key, op.max_parallelism)
        if kg is not None:
            wanted = {kg} if wanted is None else wanted & {kg}
    key_list = builder.column("key") if key is not None else None
    for _, backend in _keyed_backends(sp, op):
        if layout.name not in backend.layouts:
            continue
        if key is not None and hasattr(backend, "scan_states"):
            scan = backend.scan_states([(layout, builder)], mode, wanted, key=wanted_key)
        else:
            scan = backend.scan(layout, mode, builder, wanted)
        for _kg in scan:
            if len(builder) >= batch_size:
                yield from _flush(builder, key_list, wanted_key, batch_size)
    yield from _flush(builder, key_list, wanted_key, batch_size)


def _flush(
    builder: BatchBuilder, key_list: list[Any] | None, wanted_key: Any, batch_size: int
) -> Iterator[pa.RecordBatch]:
    mask = None
    if key_list is not None:
        mask = [k == wanted_key for k in key_list]
    batch = builder.flush()
    if batch is None:
        return
    if mask is not None:
        batch = batch.filter(pa.array(mask, type=pa.bool_()))
        if batch.num_rows == 0:
            return
    yield from split_batch(batch, batch_size)


def _read_operator(
    sp: Any, op: Any, layout: StateLayout, batch_size: int
) -> Iterator[pa.RecordBatch]:
    from statequery.backends.operator import read_broadcast_state, read_operator_list_state

    schema = state_schema(layout)
    builder = BatchBuilder(schema, layout)
    for os_ in _operator_streams(sp, op):
        part = os_.handle.partition(layout.name)
        if part is None or not part.offsets:
            continue
        compressed = bool(getattr(os_.proxy, "compressed", False))
        sub_layout = os_.layouts.get(layout.name, layout)
        if layout.kind == "broadcast":
            if len(part.offsets) != 1:
                from statequery.exceptions import CorruptStateError

                raise CorruptStateError(
                    f"broadcast state {layout.name!r} has {len(part.offsets)} offsets (1 expected)",
                    os_.stream.name,
                )
            read_broadcast_state(
                os_.stream, sub_layout, part.offsets[0], os_.all_offsets, compressed, builder
            )
            break  # every subtask holds a full copy: the first one is the state
        read_operator_list_state(
            os_.stream, sub_layout, part.offsets, os_.all_offsets, compressed, os_.subtask, builder
        )
        if len(builder) >= batch_size:
            yield from _flush(builder, None, None, batch_size)
    yield from _flush(builder, None, None, batch_size)


# -- lookup ----------------------------------------------------------------------------------------


def lookup(savepoint: Any, key: Any, operator: Any = None) -> dict[tuple[str, str], pa.Table]:
    """Everything every keyed state holds for ``key``: ``{(operator, state): Table}``.

    Only the key group that can hold the key is read (computed as Flink computes it). With
    ``operator`` None every operator with keyed state is searched (operators whose key type does
    not accept the key are skipped). States without rows for the key are left out.
    """
    sp = _as_savepoint(savepoint)
    if _is_state_info(key):
        # lookup(savepoint, state_info, key): one state's rows for one key
        info, key = key, operator
        op = _operator(sp, info)
        return {(_op_label(op), info.name): read_table(sp, op, info.name, key=key)}
    ops = [_operator(sp, operator)] if operator is not None else list(_metadata(sp).operators)
    out: dict[tuple[str, str], pa.Table] = {}
    for op in ops:
        if not any(st.managed_keyed is not None for st in op.subtasks):
            continue
        try:
            backends = _keyed_backends(sp, op)
        except UnsupportedFormatError:
            if operator is not None:
                raise
            continue
        refs = [r for r in list_states(sp, op) if r.layout.keyed]
        if not refs:
            continue
        key_spec = refs[0].layout.key
        for ref in refs:
            if ref.layout.is_timer:
                continue
            key_spec = ref.layout.key
            break
        try:
            wanted_key = _normalize_key(key, key_spec)
            kg = key_group_of_key(key, key_spec, op.max_parallelism)
        except (InvalidOptionError, UnsupportedFormatError, TypeError, ValueError, OverflowError):
            if operator is not None:
                raise
            continue
        builders = {r.state: BatchBuilder(state_schema(r.layout), r.layout) for r in refs}
        for _, backend in backends:
            requests = [(r.layout, builders[r.state]) for r in refs if r.state in backend.layouts]
            if not requests:
                continue
            wanted_kgs = None if kg is None else {kg}
            if hasattr(backend, "scan_states"):
                for _kg in backend.scan_states(requests, None, wanted_kgs, key=wanted_key):
                    pass
            else:  # a backend without multi-state scans: one pass per state
                for layout, builder in requests:
                    for _kg in backend.scan(layout, None, builder, wanted_kgs):
                        pass
        for r in refs:
            builder = builders[r.state]
            batches = list(_flush(builder, builder.column("key"), wanted_key, 1 << 62))
            if batches:
                out[(_op_label(op), r.state)] = pa.Table.from_batches(
                    batches, schema=builder.schema
                )
    return out
