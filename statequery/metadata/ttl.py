"""The state TTL a Flink SQL compiled plan declares, per state of a savepoint.

A savepoint does not keep a state's time-to-live: a TTL state's values carry their last access
time (``TtlStateFactory$TtlSerializer``), not the duration. A SQL job's compiled plan does: every
stateful node lists its states with the TTL in force (``table.exec.state.ttl``, or a
``/*+ STATE_TTL(...) */`` hint on that operator)::

    "state": [{"index": 0, "ttl": "2 s", "name": "groupAggregateState"}]

:func:`declared_ttls` gives the milliseconds for the TTL states (``state_meta.ttl``) of the
operators matched to a plan node (:func:`statequery.metadata.plan.match_operators`). A node with
one declared TTL (or the same TTL for all its states) gives it to all its TTL states; a join's two
(``leftState``, ``rightState``) go to ``left-records`` and ``right-records``. Anything else is left
null rather than guessed. ``0`` means the plan declares no TTL (the state never expires).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["declared_ttls", "parse_duration_ms"]

_UNITS_MS = {
    "ns": 1e-6, "nano": 1e-6, "nanos": 1e-6, "nanosecond": 1e-6, "nanoseconds": 1e-6,
    "us": 1e-3, "µs": 1e-3, "micro": 1e-3, "micros": 1e-3, "microsecond": 1e-3,
    "microseconds": 1e-3,
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-zµ]*)\s*$", re.IGNORECASE)

# the states of a two-input join, in the order of the plan's state indexes
_JOIN_STATES = ("left-records", "right-records")


def parse_duration_ms(text: Any) -> int | None:
    """Milliseconds of a Flink duration (``"2 s"``, ``"1 d"``, ``"500 ms"``, ``"0 ms"``), or
    None when it is not one."""
    if not isinstance(text, str):
        return None
    m = _DURATION.match(text)
    if m is None:
        return None
    unit = m.group(2).lower() or "ms"
    factor = _UNITS_MS.get(unit)
    if factor is None:
        return None
    return int(int(m.group(1)) * factor)


def _node_ttls(raw: Mapping[str, Any]) -> list[int | None]:
    """The declared TTL of each state of a plan node, by its ``index``."""
    entries = raw.get("state")
    if not isinstance(entries, list):
        return []
    indexed: dict[int, int | None] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            continue
        index = e.get("index", i)
        if isinstance(index, int):
            indexed[index] = parse_duration_ms(e.get("ttl"))
    return [indexed.get(i) for i in range(max(indexed) + 1)] if indexed else []


def declared_ttls(
    plan_nodes: Mapping[str, Any], operators: Iterable[Any]
) -> dict[tuple[str, str], int]:
    """``(operator id, state name) -> TTL in ms`` for the TTL states of ``operators`` (objects
    with ``operator_id`` and ``states``, each with ``name`` and ``ttl``) whose plan node
    (``plan_nodes``: operator id -> :class:`~statequery.metadata.plan.PlanNode`) declares it."""
    out: dict[tuple[str, str], int] = {}
    for op in operators:
        node = plan_nodes.get(op.operator_id)
        if node is None:
            continue
        ttls = _node_ttls(node.raw)
        if not ttls:
            continue
        states = [s.name for s in op.states if getattr(s, "ttl", False)]
        if len(ttls) == 2 and set(states) <= set(_JOIN_STATES):
            for name in states:
                ttl = ttls[_JOIN_STATES.index(name)]
                if ttl is not None:
                    out[(op.operator_id, name)] = ttl
            continue
        distinct = set(ttls)
        if len(distinct) == 1 and None not in distinct:
            (ttl,) = distinct
            assert ttl is not None
            for name in states:
                out[(op.operator_id, name)] = ttl
    return out
