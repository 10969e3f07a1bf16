"""One factory for the decode path: the compiled one (``statequery/backends/_read.pyx``, built
by ``pip install`` when a C compiler is present) or the pure-Python reference
(:func:`statequery.backends.keygroups.scan_key_group` and the entry handlers of
:class:`~statequery.backends.keygroups.CompositeEntryDecoder`).

Both produce identical tables (``tests/backends/test_fastpath.py`` checks every fixture).
``STATEQUERY_PURE_PYTHON=1`` in the environment forces the pure-Python path; it is read at
every scan, so tests can switch per test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pyarrow as pa

from statequery.arrow.schemas import StateLayout
from statequery.serializers.readers import primitive_name
from statequery.serializers.spec import (
    NamespaceSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    SerializerSpec,
    TimerSpec,
)

__all__ = ["PURE_ENV", "bulk_feeder", "compiled", "entry_sink", "key_group_scanner"]

PURE_ENV = "STATEQUERY_PURE_PYTHON"

try:
    from statequery.backends import _read as _compiled  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler at install time): the pure-Python path
    _compiled = None


def compiled() -> ModuleType | None:
    """The compiled decode module, or None (not built, or ``STATEQUERY_PURE_PYTHON`` set)."""
    if _compiled is None or os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    return _compiled  # type: ignore[no-any-return]


def key_group_scanner() -> Callable[..., int]:
    """``scan_key_group(buf, kg, prefix_len, handlers, finishers)`` of the chosen path."""
    mod = compiled()
    if mod is not None:
        return mod.scan_key_group  # type: ignore[no-any-return]
    from statequery.backends.keygroups import scan_key_group

    return scan_key_group


# primitive name -> (compiled type code name, Arrow type of its column)
_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "long": ("T_LONG", pa.int64()),
    "int": ("T_INT", pa.int32()),
    "short": ("T_SHORT", pa.int16()),
    "byte": ("T_BYTE", pa.int8()),
    "double": ("T_DOUBLE", pa.float64()),
    "float": ("T_FLOAT", pa.float32()),
    "boolean": ("T_BOOL", pa.bool_()),
    "string": ("T_STRING", pa.string()),
}


def _code(mod: ModuleType, spec: SerializerSpec | None, arrow: pa.DataType | None) -> int:
    """The compiled type code for values of ``spec`` in a column of type ``arrow``; 0 when the
    compiled path does not decode that shape."""
    if spec is None or not spec.decodable or arrow is None:
        return 0
    entry: tuple[str, pa.DataType] | None = None
    if isinstance(spec, PrimitiveSpec):
        entry = _TYPES.get(primitive_name(spec.name))
    elif isinstance(spec, PrimitiveArraySpec) and primitive_name(spec.element) == "byte":
        entry = ("T_BYTES", pa.binary())
    if entry is None or not arrow.equals(entry[1]):
        return 0
    return int(getattr(mod, entry[0]))


def _is_void(spec: SerializerSpec | None) -> bool:
    return isinstance(spec, NamespaceSpec) and spec.name == "void"


def _field(schema: pa.Schema, name: str) -> pa.DataType | None:
    i = schema.get_field_index(name)
    return None if i < 0 else schema.field(i).type


def entry_sink(layout: StateLayout, mode: str, schema: pa.Schema) -> Any | None:
    """A compiled entry handler decoding ``layout``'s entries straight into Arrow buffers, or
    None when the compiled path is off or does not cover this shape (the caller then uses the
    pure-Python handlers). Shapes: VoidNamespace, no TTL; value/reducing/aggregating, timers,
    map entries (``rows``) and lists (``rows``, ``flat``) of primitives, strings and byte arrays.
    """
    mod = compiled()
    if mod is None or layout.ttl or not pa.types.is_null(_field(schema, "namespace") or pa.int8()):
        return None
    key_type = _field(schema, "key")
    if layout.is_timer:
        spec = layout.value
        key_spec = spec.key if isinstance(spec, TimerSpec) else layout.key
        ns_spec = spec.namespace if isinstance(spec, TimerSpec) else layout.namespace
        key = _code(mod, key_spec, key_type)
        if not key or not _is_void(ns_spec):
            return None
        return mod.EntrySink(mod.K_TIMER, key, 0)
    if not _is_void(layout.namespace):
        return None
    key = _code(mod, layout.key, key_type)
    if not key:
        return None
    kind = layout.kind
    if kind in ("value", "reducing", "aggregating"):
        value = _code(mod, layout.value, _field(schema, "value"))
        return mod.EntrySink(mod.K_VALUE, key, value) if value else None
    if kind == "map" and mode == "rows":
        value = _code(mod, layout.value, _field(schema, "value"))
        user_key = _code(mod, layout.user_key, _field(schema, "user_key"))
        if value and user_key:
            return mod.EntrySink(mod.K_MAP, key, value, user_key)
        return None
    if kind == "list":
        value_type = _field(schema, "value")
        if mode == "flat":
            value = _code(mod, layout.value, value_type)
            return mod.EntrySink(mod.K_LIST_FLAT, key, value) if value else None
        if value_type is not None and pa.types.is_list(value_type):
            value = _code(mod, layout.value, value_type.value_type)
            return mod.EntrySink(mod.K_LIST, key, value) if value else None
    return None


def bulk_feeder(on_entry: Any) -> Callable[..., Any] | None:
    """``feed_key_group`` of the compiled module when ``on_entry`` is one of its sinks (RocksDB
    entries then go to the sink in bulk), else None."""
    mod = compiled()
    if mod is None or not isinstance(on_entry, mod.EntrySink):
        return None
    return mod.feed_key_group  # type: ignore[no-any-return]
