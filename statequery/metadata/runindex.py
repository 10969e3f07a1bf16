"""The run index: where each state's entries lie inside each key group of a canonical stream.

In a canonical key group (``FullSnapshotAsyncWriter``) the entries of each state form one **run**:
a 2-byte state id, the entries (the last one flagged), then the next state id or the
end-of-key-group mark (:func:`statequery.backends.keygroups.scan_key_group`). Walking a key group
records its runs (state id, offset of the first entry in the decompressed key group, length in
bytes); with them, a read of some states of an uncompressed stream fetches only those states'
byte ranges, and a read of a snappy-compressed one starts walking at the run.

The index is recorded in memory by a :class:`~statequery.savepoint.Savepoint` during every full
walk of a key group, and persisted on request in the StateMeta snapshot
(``statequery snapshot PATH --index``, docs/statemeta.md). It is never trusted blindly: a read
checks every run it uses against the bytes (docs/statemeta.md, "Trust").

Layout: per keyed handle (operator id, subtask index), per key group a flat array of ints
``(state id, start, length, state id, start, length, ...)`` in stream order (in memory an
``array('q')``: 8 bytes per number).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statequery.exceptions import CorruptStateError

__all__ = ["RUN_INDEX_VERSION", "IndexedRuns", "RunIndex", "runs_of"]

#: the layout version of the ``run_index`` section of the StateMeta snapshot
RUN_INDEX_VERSION = 1

Runs = tuple[int, ...]


@dataclass(frozen=True)
class IndexedRuns:
    """The runs a :class:`~statequery.scan.ScanTask` may use: for each of its key groups the index
    covers, the runs of ``states`` (flat ``state id, start, length`` triples; an empty tuple: none
    of these states has entries in that key group). Key groups missing here are walked whole."""

    states: tuple[str, ...]
    key_groups: tuple[tuple[int, Runs], ...]

    def by_key_group(self) -> dict[int, Runs]:
        return dict(self.key_groups)


def runs_of(runs: Sequence[int], state_ids: Iterable[int]) -> Runs:
    """The triples of ``runs`` whose state id is in ``state_ids``."""
    ids = set(state_ids)
    out: list[int] = []
    for i in range(0, len(runs), 3):
        if runs[i] in ids:
            out += runs[i : i + 3]
    return tuple(out)


class RunIndex:
    """``(operator id, subtask index) -> {key group: runs}``; safe to record from several
    threads (one lock, held only to insert)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, handles: Mapping[tuple[str, int], Mapping[int, Sequence[int]]] | None = None
    ) -> None:
        self._handles: dict[tuple[str, int], dict[int, array[int]]] = {
            k: {kg: array("q", runs) for kg, runs in v.items()} for k, v in (handles or {}).items()
        }
        self._lock = threading.Lock()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunIndex) and self._handles == other._handles

    def __repr__(self) -> str:
        return f"RunIndex({len(self._handles)} handles, {self.key_group_count} key groups)"

    def __bool__(self) -> bool:
        return any(self._handles.values())

    @property
    def key_group_count(self) -> int:
        return sum(len(v) for v in self._handles.values())

    def record(self, operator_id: str, subtask: int, key_group: int, runs: Sequence[int]) -> None:
        """Remember the runs found by a walk of one whole key group."""
        key = (operator_id, subtask)
        found = self._handles.get(key)
        if found is None:
            with self._lock:
                found = self._handles.setdefault(key, {})
        found[key_group] = array("q", runs)

    def runs(self, operator_id: str, subtask: int) -> Mapping[int, Sequence[int]]:
        """The key groups of one keyed handle that were indexed (empty when none)."""
        return self._handles.get((operator_id, subtask), {})

    def handles(self) -> list[tuple[str, int]]:
        return sorted(self._handles)

    def without(self, operator_ids: Iterable[str]) -> RunIndex:
        drop = set(operator_ids)
        return RunIndex({k: v for k, v in self._handles.items() if k[0] not in drop})

    # -- the snapshot section ------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        """The ``run_index`` section of the StateMeta snapshot body (docs/statemeta.md)."""
        return {
            "version": RUN_INDEX_VERSION,
            "handles": [
                [op, subtask, {kg: list(r) for kg, r in sorted(groups.items())}]
                for (op, subtask), groups in sorted(self._handles.items())
            ],
        }

    @classmethod
    def from_doc(cls, doc: Any, source: str) -> RunIndex:
        """Parse the section; a section of another layout version is dropped (None would be
        returned by the caller's ``.get``: here an empty index). Malformed: CorruptStateError."""
        if not isinstance(doc, dict):
            raise CorruptStateError("StateMeta snapshot run index is not a map", source)
        if doc.get("version") != RUN_INDEX_VERSION:
            return cls()
        handles: dict[tuple[str, int], dict[int, Sequence[int]]] = {}
        try:
            for op, subtask, groups in doc["handles"]:
                if not isinstance(op, str) or not _is_int(subtask) or not isinstance(groups, dict):
                    raise ValueError(f"bad handle entry {op!r}, {subtask!r}")
                by_kg: dict[int, Sequence[int]] = {}
                for kg, runs in groups.items():
                    if not _is_int(kg) or not isinstance(runs, list) or len(runs) % 3:
                        raise ValueError(f"bad runs of key group {kg!r}")
                    if not all(_is_int(x) and 0 <= x < 1 << 62 for x in runs):
                        raise ValueError(f"bad runs of key group {kg}")
                    by_kg[kg] = runs
                handles[(op, subtask)] = by_kg
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptStateError(
                f"malformed run index in the StateMeta snapshot: {e}", source
            ) from e
        return cls(handles)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
