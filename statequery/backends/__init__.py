"""Keyed-state backends: one per on-disk layout, decided per keyed state handle by the planner.

* :mod:`~statequery.backends.base` — the :class:`KeyedBackend` protocol, :class:`KeyedContext`
  (what a backend is given) and :class:`HandleStream` (a stream handle's bytes);
* :mod:`~statequery.backends.registry` — which backend reads a handle
  (:func:`keyed_backend_kind`, decided once at planning from the model), opening it
  (:func:`open_keyed_backend`) and the plug-in registry (:func:`register_keyed_backend`:
  RocksDB native snapshots, type 11, and the changelog backend, type 14);
* :mod:`~statequery.backends.keyedstream` — the key-group stream backends:
  :class:`CanonicalKeyedBackend` (canonical savepoints, type 7, any backend, plain or snappy:
  :mod:`~statequery.backends.keygroups`) and :class:`HeapKeyedBackend` (hashmap checkpoints and
  native savepoints, type 12: :mod:`~statequery.backends.heap`).
"""

from __future__ import annotations

from statequery.backends.base import HandleStream, KeyedBackend, KeyedContext
from statequery.backends.keyedstream import CanonicalKeyedBackend, HeapKeyedBackend
from statequery.backends.registry import (
    BackendKind,
    keyed_backend_for,
    keyed_backend_kind,
    open_keyed_backend,
    register_keyed_backend,
)
from statequery.metadata.handles import is_heap_layout

__all__ = [
    "BackendKind",
    "CanonicalKeyedBackend",
    "HandleStream",
    "HeapKeyedBackend",
    "KeyedBackend",
    "KeyedContext",
    "is_heap_layout",
    "keyed_backend_for",
    "keyed_backend_kind",
    "open_keyed_backend",
    "register_keyed_backend",
]
