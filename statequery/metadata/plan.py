"""Flink SQL compiled plans: the column names of a SQL job's state.

The state of a Flink SQL job is ``RowData`` without field names (``f0, f1, ...``) in operators
whose uids are generated. The compiled plan (``COMPILE PLAN``, ``EXPLAIN PLAN ... JSON``,
``StatementSet.compilePlan``) describes every node: its id, kind, the states it declares and its
input/output row types with the column names the query used. This module

* parses a plan (:func:`parse_plan`),
* matches plan nodes to a savepoint's operators (:func:`match_operators`): a job run from a
  compiled plan has uids ``<node id>_<transformation>``; otherwise Flink names operators
  ``GroupAggregate[7]`` with the node id in brackets. A match must agree on the node id *and* the
  operator kind; an operator that matches nothing, or two operators claiming one node, are left
  unnamed (never guessed),
* names the RowData columns of each state of a matched operator (:func:`name_state`): keys by the
  node's grouping/partition/join keys, stored input rows by the input's columns, accumulators by
  the aggregate calls, each only when the arity agrees with what the plan says.

Without a plan nothing changes. Names are applied to the serializer specs (so ``state_meta`` types
and the Arrow schemas of reads both show them); the bytes are read exactly as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from statequery.exceptions import InvalidOptionError
from statequery.serializers.spec import (
    ListSpec,
    MapSpec,
    NullableSpec,
    OptionalSpec,
    RowDataSpec,
    SerializerSpec,
    SqlField,
    StructSpec,
    TimerSpec,
    TtlSpec,
    TupleSpec,
)

__all__ = [
    "CompiledPlan",
    "accumulator_layouts",
    "apply_plan",
    "name_operator",
    "choosers",
    "PlanNode",
    "match_operators",
    "operator_kind",
    "parse_plan",
    "table_stem",
]


@dataclass(frozen=True)
class PlanNode:
    id: int
    type: str  # e.g. "stream-exec-group-aggregate_1"
    raw: dict[str, Any]
    output: tuple[str, ...]  # output column names
    inputs: tuple[int, ...] = ()  # input node ids, in input order

    @property
    def kind(self) -> str:
        """``group-aggregate`` of ``stream-exec-group-aggregate_1``."""
        t = re.sub(r"_\d+$", "", self.type)
        for prefix in ("stream-exec-", "batch-exec-"):
            if t.startswith(prefix):
                return t[len(prefix):]
        return t


@dataclass(frozen=True)
class CompiledPlan:
    nodes: dict[int, PlanNode]
    flink_version: str = ""
    text: str = field(default="", repr=False)

    def consumers(self, node: PlanNode) -> list[tuple[PlanNode, int]]:
        """The nodes reading ``node``'s output, with the input index they read it at."""
        return [(n, i) for n in self.nodes.values() for i, src in enumerate(n.inputs)
                if src == node.id]

    def input_columns(self, node: PlanNode, index: int = 0) -> tuple[str, ...] | None:
        if index >= len(node.inputs):
            return None
        src = self.nodes.get(node.inputs[index])
        return src.output if src is not None else None


def _split_top(s: str, opening: str = "<(", closing: str = ">)") -> list[str]:
    """Split ``s`` at commas outside brackets (``opening``/``closing``: <> and () by default)
    and backticks."""
    out: list[str] = []
    cur: list[str] = []
    depth, tick = 0, False
    for ch in s:
        if ch == "`":
            tick = not tick
        elif not tick and ch in opening:
            depth += 1
        elif not tick and ch in closing:
            depth -= 1
        if ch == "," and depth == 0 and not tick:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def row_field_names(row_type: Any) -> tuple[str, ...]:
    """Column names of a plan's row type: ``ROW<`a` INT, `b` STRING>`` or ``{"type": "ROW",
    "fields": [{"name": ...}]}``."""
    if isinstance(row_type, dict):
        return tuple(str(f.get("name", "")) for f in row_type.get("fields", []))
    if not isinstance(row_type, str):
        return ()
    s = row_type.strip()
    if s.endswith("NOT NULL"):
        s = s[: -len("NOT NULL")].strip()
    if not (s.startswith("ROW<") and s.endswith(">")):
        return ()
    names = []
    for part in _split_top(s[4:-1]):
        part = part.strip()
        if part.startswith("`"):
            end = part.find("`", 1)
            while end + 1 < len(part) and part[end + 1] == "`":  # `` escapes a backtick
                end = part.find("`", end + 2)
            names.append(part[1:end].replace("``", "`"))
        else:
            names.append(part.split(" ", 1)[0])
    return tuple(names)


def parse_plan(text: str | bytes, source: str = "compiled plan") -> CompiledPlan:
    """Parse a compiled plan's JSON; :class:`InvalidOptionError` naming ``source`` if it is not
    one."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:  # json recurses per nesting level: RecursionError
        raise InvalidOptionError(f"{source}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InvalidOptionError(f"{source}: not a Flink compiled plan (no \"nodes\" list)")
    inputs: dict[int, list[int]] = {}
    for edge in doc.get("edges") or []:
        if isinstance(edge, dict) and isinstance(edge.get("target"), int):
            inputs.setdefault(edge["target"], []).append(int(edge["source"]))
    nodes = {}
    for n in doc["nodes"]:
        if not isinstance(n, dict) or not isinstance(n.get("id"), int):
            raise InvalidOptionError(f"{source}: a node without an integer id")
        nodes[n["id"]] = PlanNode(
            n["id"], str(n.get("type", "")), n, row_field_names(n.get("outputType")),
            tuple(inputs.get(n["id"], ())),
        )
    raw = text.decode("utf-8") if isinstance(text, bytes) else text
    return CompiledPlan(nodes, str(doc.get("flinkVersion", "")), raw)


# -- matching ------------------------------------------------------------------------------------

_UID = re.compile(r"^(\d+)_([a-z0-9-]+)$")
_NAME = re.compile(r"^([A-Za-z]+)\[(\d+)\]")


def operator_kind(name: str) -> str:
    """``group-aggregate`` of an operator name ``GroupAggregate[7]``."""
    m = _NAME.match(name)
    base = m.group(1) if m else name
    return re.sub(r"(?<!^)(?=[A-Z])", "-", base).lower()


# operator name kinds that differ from their node kind
_NAME_KIND = {"sink-materializer": "sink", "constraint-enforcer": "sink"}


def _node_of(plan: CompiledPlan, uid: str, name: str) -> int | None:
    m = _UID.match(uid or "")
    by_uid = int(m.group(1)) if m else None
    n = _NAME.match(name or "")
    by_name = int(n.group(2)) if n else None
    if by_uid is not None and by_name is not None and by_uid != by_name:
        return None  # contradicting: refuse
    node_id = by_uid if by_uid is not None else by_name
    if node_id is None or node_id not in plan.nodes:
        return None
    if n is not None:
        kind = operator_kind(name)
        node_kind = plan.nodes[node_id].kind
        if _NAME_KIND.get(kind, kind) != node_kind:
            return None  # the name's kind is not the node's: a different plan
    return node_id


def match_operators(plan: CompiledPlan, operators: Iterable[Any]) -> dict[str, PlanNode]:
    """operator id -> its plan node, for the operators that match one node unambiguously.

    ``operators`` have ``operator_id``, ``uid`` and ``name``. Several operators of one node
    (a sink's writer, constraint enforcer and materializer) share it only when their kinds differ;
    two operators of the same kind claiming one node match nothing.
    """
    claims: dict[tuple[int, str], list[str]] = {}
    for op in operators:
        node_id = _node_of(plan, getattr(op, "uid", "") or "", getattr(op, "name", "") or "")
        if node_id is not None:
            claims.setdefault((node_id, operator_kind(op.name or "")), []).append(op.operator_id)
    out = {}
    for (node_id, _), ids in claims.items():
        if len(ids) == 1:
            out[ids[0]] = plan.nodes[node_id]
    return out


def table_stem(node: PlanNode, operator_name: str) -> str:
    """``<node>_<operator kind>``, e.g. ``10_group_aggregate`` or ``140_sink_materializer``."""
    return f"{node.id}_{operator_kind(operator_name).replace('-', '_')}"


# -- naming ---------------------------------------------------------------------------------------


def _pick(names: tuple[str, ...] | None, indices: Any) -> tuple[str, ...] | None:
    if names is None or not isinstance(indices, list):
        return None
    try:
        return tuple(names[i] for i in indices)
    except (IndexError, TypeError):
        return None


def _fields(spec: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(spec, dict):
            return None
        spec = spec.get(p)
    return spec


def key_columns(plan: CompiledPlan, node: PlanNode) -> tuple[str, ...] | None:
    """The names of the key columns of a keyed SQL operator, from its node."""
    raw = node.raw
    inp = plan.input_columns(node, 0)
    k = node.kind
    if k in ("group-aggregate", "global-group-aggregate", "local-window-aggregate",
             "global-window-aggregate", "window-aggregate"):
        if k in ("global-group-aggregate", "global-window-aggregate"):
            # the key is the first columns of the local aggregation's output (its grouping
            # indices refer to the local aggregation's input row)
            grouping = raw.get("grouping")
            if inp is not None and isinstance(grouping, list) and len(grouping) <= len(inp):
                return inp[:len(grouping)]
            local_in = row_field_names(raw.get("localAggInputRowType"))
            return _pick(local_in, grouping)
        return _pick(inp, raw.get("grouping"))
    if k == "incremental-group-aggregate":
        # keyed by the partial grouping (group key + distinct hash bucket) over its input
        return _pick(inp, raw.get("partialAggGrouping"))
    if k == "rank":
        return _pick(inp, _fields(raw, "partition", "fields"))
    if k == "window-rank":
        return _pick(inp, _fields(raw, "partitionSpec", "fields"))
    if k == "window-deduplicate":
        return _pick(inp, raw.get("partitionKeys"))
    if k in ("deduplicate", "changelog-normalize"):
        return _pick(inp, raw.get("uniqueKeys"))
    if k in ("join", "temporal-join"):
        return _pick(inp, _fields(raw, "joinSpec", "leftKeys"))
    if k == "interval-join":
        return _pick(inp, _fields(raw, "intervalJoinSpec", "joinSpec", "leftKeys"))
    if k == "over-aggregate":
        return _pick(inp, _fields(raw, "overSpec", "partition", "fields"))
    if k == "match":
        return _pick(inp, _fields(raw, "matchSpec", "partition", "fields"))
    if k == "sink":  # the upsert materializer is keyed by the sink's primary key
        return _sink_pk(node)
    return None


def _sink_schema(node: PlanNode) -> Any:
    return _fields(node.raw, "dynamicTableSink", "table", "resolvedTable", "schema")


def _sink_pk(node: PlanNode) -> tuple[str, ...] | None:
    pk = _fields(_sink_schema(node), "primaryKey", "columns")
    return tuple(str(c) for c in pk) if isinstance(pk, list) and pk else None


def _sink_columns(node: PlanNode) -> tuple[str, ...] | None:
    cols = _fields(_sink_schema(node), "columns")
    if not isinstance(cols, list):
        return None
    return tuple(str(c.get("name", "")) for c in cols if isinstance(c, dict))


#: the accumulator fields of Flink's built-in aggregate functions that keep more than one field
#: in the aggregation's accumulator row (the declarative functions' ``aggBufferAttributes``), by
#: the call's function name (``internalName`` ``$AVG$1`` -> ``AVG``) and whether the call
#: retracts. Every other built-in keeps one field: COUNT, SUM without retraction, $SUM0, MIN/MAX
#: (a value, or with retraction a structured accumulator whose map is a MapView), FIRST_VALUE and
#: LAST_VALUE (a structured accumulator), LISTAGG with retraction, COLLECT, JSON_OBJECTAGG,
#: JSON_ARRAYAGG, SINGLE_VALUE.
_MULTI_FIELD: dict[tuple[str, bool], tuple[str, ...]] = {
    ("AVG", False): ("sum", "count"),
    ("AVG", True): ("sum", "count"),
    ("SUM", True): ("sum", "count"),  # SumWithRetractAggFunction
    ("LISTAGG", False): ("delimiter", "concat"),  # ListAggFunction (declarative)
}
_ONE_FIELD_BUILTINS = {
    "COUNT", "SUM", "$SUM0", "SUM0", "MIN", "MAX", "FIRST_VALUE", "LAST_VALUE", "LISTAGG",
    "COLLECT", "JSON_OBJECTAGG_NULL_ON_NULL", "JSON_OBJECTAGG_ABSENT_ON_NULL",
    "JSON_ARRAYAGG_NULL_ON_NULL", "JSON_ARRAYAGG_ABSENT_ON_NULL", "SINGLE_VALUE",
    "BIT_AND", "BIT_OR", "BIT_XOR", "ARRAY_AGG",
}


def _function(call: Any) -> str:
    """``AVG`` of a call's ``internalName`` ``$AVG$1`` (``$SUM0`` of ``$$SUM0$1``)."""
    name = str(call.get("internalName") or call.get("name") or "") if isinstance(call, dict) \
        else ""
    m = re.match(r"^\$(.+)\$\d+$", name)
    return (m.group(1) if m else name).upper()


#: how deep _passes follows an expression's operands (a planner's are a few levels deep; a plan's
#: JSON may nest up to the interpreter's recursion limit)
MAX_EXPR_DEPTH = 32


def _passes(expr: Any, index: int, depth: int = 0) -> str | None:
    """How a Calc projection ``expr`` uses input column ``index``: ``"value"`` when it is that
    column (under CAST, or as the non-null branch of a CASE/IF whose other branch is NULL: the
    planner's ``SUM`` from ``$SUM0`` and ``COUNT``), ``"sum"``/``"count"`` when it is the
    numerator/denominator of a division (the planner's ``AVG`` from ``SUM``/``COUNT``), else
    None."""
    if not isinstance(expr, dict) or depth > MAX_EXPR_DEPTH:
        return None
    kind = expr.get("kind")
    if kind == "INPUT_REF":
        return "value" if expr.get("inputIndex") == index else None
    if kind != "CALL":
        return None
    op = _function({"internalName": expr.get("internalName") or expr.get("syntax") or ""})
    ops = expr.get("operands") or []
    if op == "CAST" and len(ops) == 1:
        return _passes(ops[0], index, depth + 1)
    if op in ("CASE", "IF") and len(ops) == 3:
        branches = [_passes(o, index, depth + 1) for o in ops[1:]]
        nulls = [isinstance(o, dict) and o.get("kind") == "LITERAL" and o.get("value") is None
                 for o in ops[1:]]
        for b, other_null in zip(branches, reversed(nulls), strict=True):
            if b is not None and other_null:
                return b
        if _is_count_guard(ops[0], index) and nulls[1] and _value_ref(ops[1]) not in (None, index):
            # CASE WHEN count > 0 THEN sum ELSE NULL: the count the planner's SUM (over an OVER
            # window: COUNT and $SUM0) is guarded by
            return "count"
        return None
    if op == "/" and len(ops) == 2:
        top, bottom = _passes(ops[0], index, depth + 1), _passes(ops[1], index, depth + 1)
        if top == "value" and bottom is None:
            return "sum"
        if bottom == "value" and top in (None, "count"):
            return "count"
    return None


def _value_ref(expr: Any) -> int | None:
    """The input column ``expr`` is (possibly under CASTs: a loop), else None."""
    while isinstance(expr, dict):
        if expr.get("kind") == "INPUT_REF":
            index = expr.get("inputIndex")
            return index if isinstance(index, int) else None
        ops = expr.get("operands") or []
        if not (expr.get("kind") == "CALL" and len(ops) == 1 and _function(
                {"internalName": expr.get("internalName") or expr.get("syntax") or ""}) == "CAST"):
            return None
        expr = ops[0]
    return None


def _is_count_guard(expr: Any, index: int) -> bool:
    """Whether ``expr`` is ``<column index> > 0``."""
    if not isinstance(expr, dict) or expr.get("kind") != "CALL":
        return False
    ops = expr.get("operands") or []
    op = _function({"internalName": expr.get("internalName") or expr.get("syntax") or ""})
    return (op == ">" and len(ops) == 2 and _value_ref(ops[0]) == index
            and isinstance(ops[1], dict) and ops[1].get("kind") == "LITERAL"
            and ops[1].get("value") == 0)


#: plan nodes passing their input's rows on unchanged (column for column)
_PASS_THROUGH = ("exchange", "mini-batch-assigner", "watermark-assigner", "drop-update-before")


def _planner_name(name: str) -> bool:
    """A column the planner named: ``$f1``, ``$3``, an OVER aggregation's ``w0$o1``, or
    Calcite's ``EXPR$13`` for a select item without an alias."""
    return name.startswith("$") or re.match(r"^(w\d+\$o|EXPR\$)\d+$", name) is not None


def query_name(plan: CompiledPlan, node: PlanNode, index: int, depth: int = 0) -> str | None:
    """The query's name of ``node``'s output column ``index`` when the planner named it
    ``$f<n>``: followed through Calc projections (a column passed on, a ``SUM``/``AVG`` the
    planner rebuilt from ``$SUM0``/``COUNT``) to the first name that is not the planner's, or to
    the sink's column. None when it is used several ways or not at all."""
    out = node.output
    if index < len(out) and not _planner_name(out[index]):
        return out[index]
    if depth > 8:
        return None
    consumers = plan.consumers(node)
    if len(consumers) != 1:
        return None
    nxt, _ = consumers[0]
    if nxt.kind == "sink":
        cols = _sink_columns(nxt)
        return cols[index] if cols and index < len(cols) else None
    if nxt.kind in _PASS_THROUGH:
        return query_name(plan, nxt, index, depth + 1)
    if nxt.kind in ("local-window-aggregate", "local-group-aggregate"):
        # the partial aggregate of a split (distinct) aggregation, merged again by the local and
        # global aggregation after it: named after the call that takes it as its argument
        calls = nxt.raw.get("aggCalls") or []
        ks = [k for k, c in enumerate(calls) if isinstance(c, dict) and c.get("argList") == [index]]
        after = plan.consumers(nxt)
        if len(ks) != 1 or len(after) != 1:
            return None
        final = after[0][0]
        while final.kind in _PASS_THROUGH:
            after = plan.consumers(final)
            if len(after) != 1:
                return None
            final = after[0][0]
        grouping = final.raw.get("grouping")
        first = len(grouping) if isinstance(grouping, list) else 0
        return query_name(plan, final, first + ks[0], depth + 1)
    if nxt.kind != "calc" or nxt.raw.get("condition") is not None:
        return None
    uses = [(i, _passes(e, index)) for i, e in enumerate(nxt.raw.get("projection") or [])]
    direct = [i for i, u in uses if u == "value"]
    if len(direct) == 1:
        return query_name(plan, nxt, direct[0], depth + 1)
    parts = [(i, u) for i, u in uses if u in ("sum", "count")]
    if not direct and len(parts) == 1:
        name = query_name(plan, nxt, parts[0][0], depth + 1)
        return None if name is None else f"{name}.{parts[0][1]}"
    return None


def _over_calls(node: PlanNode) -> list[tuple[Any, bool]] | None:
    """The aggregate calls of an OVER aggregation, over all its window groups in order, each
    with whether it retracts (a bounded frame: rows leave it), or None for another node."""
    if node.kind != "over-aggregate":
        return None
    groups = _fields(node.raw, "overSpec", "groups")
    if not isinstance(groups, list):
        return None
    out: list[tuple[Any, bool]] = []
    for g in groups:
        if not isinstance(g, dict) or not isinstance(g.get("aggCalls"), list):
            return None
        bounded = _fields(g, "lowerBound", "kind") == "BOUNDED_WINDOW"
        out.extend((c, bounded) for c in g["aggCalls"])
    return out


def _call_name(node: PlanNode, plan: CompiledPlan | None, i: int, call: Any) -> str:
    """Aggregate call ``i``'s name, else its output column (aggregates follow the grouping
    columns) or the query's name of it."""
    if node.kind == "over-aggregate":
        # an OVER aggregation appends its calls' results (named w0$o0, ...) to its input row
        first = len(node.output) - len(_over_calls(node) or [])
        q = query_name(plan, node, first + i) if plan is not None else None
        if q is not None:
            return q
    if isinstance(call, dict) and call.get("name"):
        return str(call["name"])
    grouping = node.raw.get("grouping")
    first = len(grouping) if isinstance(grouping, list) else 0
    out = node.output
    if plan is not None and first + i < len(out):
        q = query_name(plan, node, first + i)
        if q is not None:
            return q
    return out[first + i] if first + i < len(out) else f"agg{i}"


def accumulator_layouts(node: PlanNode, plan: CompiledPlan | None = None
                        ) -> list[tuple[str, ...]]:
    """Accumulator field names of an aggregation, as Flink's generated aggregate handler lays
    them out: the fields of each aggregate call in order (one named after the call's output
    column, or ``<column>.<field>`` for a call keeping several: ``avg_price.sum``,
    ``avg_price.count``), then ``count1`` (the input row count Flink adds when the node handles
    retractions, or a window needs one, unless the query has a ``COUNT(*)``), then one placeholder
    per distinct view (``<call>_distinct_view``). Candidates with and without ``count1``; used
    only when the accumulator has that arity. Planner names (``$f1``) are followed to the
    query's through ``plan`` (:func:`query_name`). Empty when a call keeps a number of fields
    statequery does not know (a user-defined function)."""
    calls = node.raw.get("aggCalls")
    retracts = node.raw.get("aggCallNeedRetractions")
    need_retraction = bool(node.raw.get("needRetraction"))
    over = _over_calls(node)
    if over is not None:
        # OVER: one handler for the calls of all window groups; a bounded frame retracts
        calls = [c for c, _ in over]
        retracts = [r for _, r in over]
        need_retraction = any(retracts)
    if not isinstance(calls, list):
        return []

    def name(i: int, call: Any) -> str:
        return _call_name(node, plan, i, call)

    names: list[str] = []
    views: list[str] = []
    for i, c in enumerate(calls):
        n = name(i, c)
        fn = _function(c)
        retract = bool(retracts[i]) if isinstance(retracts, list) and i < len(retracts) else \
            need_retraction
        multi = _MULTI_FIELD.get((fn, retract))
        if "." in n and n.rsplit(".", 1)[1] in ("sum", "count"):
            names.append(n)  # a SUM/COUNT the planner split an AVG into
        elif multi is not None:
            names.extend(f"{n}.{f}" for f in multi)
        elif fn in _ONE_FIELD_BUILTINS or "internalName" not in c:
            names.append(n)
        else:
            return []
        if isinstance(c, dict) and c.get("distinct"):
            views.append(f"{n}_distinct_view")
    base = tuple(names)
    with_count = base + ("count1",) + tuple(views)
    without = base + tuple(views)
    # Flink counts the input rows in the query's own COUNT(*) when it has one
    count_star = any(isinstance(c, dict) and _function(c) == "COUNT" and c.get("argList") == []
                     and not c.get("distinct") for c in calls)
    if need_retraction:
        return [without] if count_star else [with_count]
    if "window" in node.kind:
        return [without, with_count]
    return [without]


_RESULT_ROOTS = {"TINYINT": "TINYINT", "SMALLINT": "SMALLINT", "INT": "INTEGER",
                 "INTEGER": "INTEGER", "BIGINT": "BIGINT", "FLOAT": "FLOAT", "DOUBLE": "DOUBLE"}


def current_values(node: PlanNode, plan: CompiledPlan | None = None
                   ) -> list[tuple[str, str, str]]:
    """The aggregates whose current value can be shown beside their accumulator fields:
    ``(name, function, result type root)`` of each ``AVG`` (``avg``: ``name.sum`` /
    ``name.count``) and ``SUM`` with retraction (``sum``: ``name.sum`` while ``name.count`` >
    0) whose result is a number other than DECIMAL."""
    calls = node.raw.get("aggCalls")
    if not isinstance(calls, list):
        return []
    retracts = node.raw.get("aggCallNeedRetractions")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            continue
        fn = _function(c)
        retract = bool(retracts[i]) if isinstance(retracts, list) and i < len(retracts) else \
            bool(node.raw.get("needRetraction"))
        root = _RESULT_ROOTS.get(str(c.get("type", "")).replace(" NOT NULL", "").strip())
        if root is not None and (fn == "AVG" or (fn == "SUM" and retract)):
            out.append((_call_name(node, plan, i, c), "avg" if fn == "AVG" else "sum", root))
    return out


def _derive(spec: SerializerSpec | None, values: list[tuple[str, str, str]]
            ) -> SerializerSpec | None:
    """``spec``'s accumulator row with the current values of ``values`` beside its fields."""
    if isinstance(spec, TtlSpec):
        inner = _derive(spec.inner, values)
        return spec if inner is None else replace(spec, inner=inner)
    if not isinstance(spec, RowDataSpec) or not values:
        return spec
    names = [f.name for f in spec.type.fields]
    derived = []
    for name, function, root in values:
        if name in names or f"{name}.sum" not in names or f"{name}.count" not in names:
            continue
        derived.append((name, function, names.index(f"{name}.sum"),
                        names.index(f"{name}.count"), root))
    return replace(spec, derived=tuple(derived)) if derived else spec


def _rename_rows(spec: SerializerSpec | None,
                 choose: Callable[[int], tuple[str, ...] | None]) -> SerializerSpec | None:
    """``spec`` with each RowData (at any nesting of list/map/tuple/TTL) renamed by
    ``choose(arity)`` when that gives names of the same arity."""
    return None if spec is None else _rename(spec, choose)


def _rename(spec: SerializerSpec, choose: Callable[[int], tuple[str, ...] | None]
            ) -> SerializerSpec:
    if isinstance(spec, RowDataSpec):
        fields = spec.type.fields
        names = choose(len(fields))
        if names is None or len(names) != len(fields) or len(set(names)) != len(names):
            return spec
        new = tuple(SqlField(n, f.type, f.description) for n, f in zip(names, fields, strict=True))
        return replace(spec, type=replace(spec.type, fields=new))
    if isinstance(spec, ListSpec):
        return replace(spec, element=_rename(spec.element, choose))
    if isinstance(spec, MapSpec):
        return replace(spec, key=_rename(spec.key, choose),
                       value=_rename_rows(spec.value, choose))
    if isinstance(spec, (TtlSpec, NullableSpec)):
        return replace(spec, inner=_rename(spec.inner, choose))
    if isinstance(spec, (TupleSpec, StructSpec)):  # StructSpec: CEP's Lockable<row>
        return replace(spec, fields=tuple(_rename(f, choose) for f in spec.fields))
    if isinstance(spec, OptionalSpec):
        return replace(spec, inner=_rename(spec.inner, choose))
    return spec


def _by_arity(*candidates: tuple[str, ...] | None) -> Callable[[int], tuple[str, ...] | None]:
    def choose(arity: int) -> tuple[str, ...] | None:
        fitting = [c for c in candidates if c is not None and len(c) == arity]
        # two different candidates of one arity: ambiguous, leave f0..fn
        return fitting[0] if fitting and all(c == fitting[0] for c in fitting) else None

    return choose


Chooser = Callable[[int], "tuple[str, ...] | None"]


def choosers(plan: CompiledPlan, node: PlanNode, state: str) -> tuple[Chooser, Chooser, Chooser]:
    """Name choosers (arity -> names) for the key, user key and value RowData of one state of
    ``node``'s operator."""
    inp = plan.input_columns(node, 0)
    k = node.kind
    key = _by_arity(key_columns(plan, node))
    rows: tuple[str, ...] | None = inp
    if k in ("join", "interval-join", "temporal-join"):
        right = plan.input_columns(node, 1)
        if "right" in state.lower():
            rows = right
            spec = node.raw.get("joinSpec") or _fields(node.raw, "intervalJoinSpec", "joinSpec")
            key = _by_arity(_pick(right, _fields(spec, "rightKeys")))
    if k == "sink":  # the materializer keeps the rows written to the sink table
        rows = _sink_columns(node) or inp
    value = _by_arity(rows)
    user_key = value
    if state in ("accState", "window-aggs"):
        layouts = accumulator_layouts(node, plan)

        def value(n: int) -> tuple[str, ...] | None:
            return next((c for c in layouts if len(c) == n), None)

    elif k in ("rank", "window-rank"):
        order = _fields(node.raw, "orderBy", "fields") or _fields(node.raw, "sortSpec", "fields")
        if isinstance(order, list):
            user_key = _by_arity(_pick(inp, [f.get("index") for f in order]))
    return key, user_key, value


def _rename_value(spec: SerializerSpec | None, kc: Chooser, uc: Chooser,
                  vc: Chooser) -> SerializerSpec | None:
    if isinstance(spec, MapSpec):
        return replace(spec, key=_rename(spec.key, uc), value=_rename_rows(spec.value, vc))
    if isinstance(spec, TimerSpec):
        return replace(spec, key=_rename(spec.key, kc))
    return _rename_rows(spec, vc)


def name_operator(plan: CompiledPlan, node: PlanNode, op: Any) -> Any:
    """An :class:`~statequery.metadata.statemeta.OperatorInfo` whose states' specs (and the
    serializers their layouts come from) carry the query's column names."""
    states = []
    for s in op.states:
        kc, uc, vc = choosers(plan, node, s.name)
        sers = dict(s.serializers)
        values = current_values(node, plan) if s.name in ("accState", "window-aggs") else []
        for k, v in sers.items():
            if k == "VALUE_SERIALIZER":
                sers[k] = _derive(_rename_value(v, kc, uc, vc), values)
            elif k in ("KEY_SERIALIZER", "USER_KEY_SERIALIZER") and s.kind in ("map",
                                                                              "broadcast"):
                sers[k] = _rename_rows(v, uc)
        s = replace(s, key_spec=_rename_rows(s.key_spec, kc),
                    user_key_spec=_rename_rows(s.user_key_spec, uc),
                    value_spec=_derive(_rename_value(s.value_spec, kc, uc, vc), values),
                    serializers=sers)
        if s.name in ("accState", "window-aggs") and s.decodable and s.reason is None:
            note = _unnamed_accumulator(plan, node, s.value_spec)
            if note is not None:
                s = replace(s, reason=note)
        states.append(s)
    key_spec = _rename_rows(op.key_spec, _by_arity(key_columns(plan, node)))
    return replace(op, key_spec=key_spec, states=tuple(states))


def _unnamed_accumulator(plan: CompiledPlan, node: PlanNode, spec: Any) -> str | None:
    """Why an accumulator row kept ``f0, f1, ...`` although its node is in the plan (None when
    it was named)."""
    spec = spec.inner if isinstance(spec, TtlSpec) else spec
    if not isinstance(spec, RowDataSpec):
        return None
    fields = [f.name for f in spec.type.fields]
    if fields != [f"f{i}" for i in range(len(fields))]:
        return None
    if not isinstance(node.raw.get("aggCalls"), list) and _over_calls(node) is None:
        return None
    layouts = accumulator_layouts(node, plan)
    if not layouts:
        return ("accumulator column names not taken from the compiled plan: an aggregate call "
                "keeps a number of fields statequery does not know (a user-defined function?)")
    shown = " or ".join(f"{len(c)} ({', '.join(c)})" for c in layouts)
    return (f"accumulator column names not taken from the compiled plan: the accumulator has "
            f"{len(fields)} fields, the plan's aggregate calls lay out {shown}")


def apply_plan(meta: Any, plan: CompiledPlan) -> Any:
    """A :class:`~statequery.metadata.statemeta.StateMeta` whose matched operators' states carry
    the query's column names and ``<node>_<operator kind>__<state>`` table names."""
    from statequery.metadata.statemeta import assign_table_names

    nodes = match_operators(plan, meta.operators)
    ops = []
    stems = {}
    for op in meta.operators:
        node = nodes.get(op.operator_id)
        if node is None:
            ops.append(op)
            continue
        stems[op.operator_id] = table_stem(node, op.name)
        ops.append(name_operator(plan, node, op))
    return replace(meta, operators=assign_table_names(ops, stems), plan=plan.text)


# -- names from the job graph's vertex descriptions ----------------------------------------------
#
# Without a compiled plan, a captured savepoint (statequery.capture) still has the job graph
# Flink's REST API gave: every vertex's description holds the planner's digest of each operator
# of its chain, one per line, e.g.
#   [4]:GroupAggregate(groupBy=[category], select=[category, COUNT(*) AS cnt, MAX(amount) AS m])
# The names of group keys and aggregate calls are in it; the arity of the state's RowData decides
# whether they fit. Only group aggregations are named this way; anything that would need a guess
# is left as ``f0, f1, ...`` with a note in the state's ``reason``.

_DIGEST = re.compile(r"^(?:\+-\s*)?\[(\d+)\]:([A-Za-z]+)\((.*)\)\s*$", re.S)
_ALIAS = re.compile(r"^(.*?)\s+AS\s+(`[^`]+`|[\w$]+)$", re.S | re.I)
_CALL = re.compile(r"^(\$?[A-Z_][A-Z0-9_]*)\((DISTINCT\s+)?", re.I)
_IDENT = re.compile(r"^[\w$]+$")
#: aggregate functions whose accumulator is one field of the aggregation's accumulator row
#: (Flink's declarative COUNT/SUM/SUM0/MIN/MAX, and the imperative *_RETRACT ones keeping a map
#: view in one field); any other call (AVG: sum and count, SUM_RETRACT, user functions ...) has
#: a width statequery does not know, and the accumulator is left unnamed
_ONE_FIELD = {"COUNT", "SUM", "SUM0", "$SUM0", "MIN", "MAX", "COUNT_RETRACT", "MIN_RETRACT",
              "MAX_RETRACT", "FIRST_VALUE", "LAST_VALUE"}
_GROUP_AGG = ("GroupAggregate", "GlobalGroupAggregate")


@dataclass(frozen=True)
class Digest:
    """One operator line of a vertex description: ``[id]:Kind(args)``."""

    node_id: int
    kind: str  # e.g. GroupAggregate
    args: dict[str, str]

    def names(self, key: str) -> tuple[str, ...] | None:
        value = self.args.get(key)
        if value is None or not (value.startswith("[") and value.endswith("]")):
            return None
        return tuple(p.strip() for p in _split_top(value[1:-1].replace("[", "(").replace(
            "]", ")")) if p.strip())


def _split_args(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = _split_top(text, "([", ")]")
    for p in parts:
        k, sep, v = p.strip().partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def parse_description(description: str) -> list[Digest]:
    """The operator digests of a vertex description (lines that are not ``[id]:Kind(...)``,
    e.g. a DataStream operator's name or ``sink[5]: Writer``, are skipped)."""
    out = []
    for line in re.split(r"<br\s*/?>|\n", description or ""):
        m = _DIGEST.match(line.strip())
        if m:
            out.append(Digest(int(m.group(1)), m.group(2), _split_args(m.group(3))))
    return out


def _column_name(item: str) -> str | None:
    """The output column of one ``select`` item: its alias, or a bare column name."""
    item = item.strip()
    m = _ALIAS.match(item)
    if m:
        name = m.group(2)
        return name[1:-1] if name.startswith("`") else name
    return item if _IDENT.match(item) else None


@dataclass(frozen=True)
class _AggNames:
    key: tuple[str, ...] | None
    acc: tuple[str, ...] | None
    note: str | None  # why the accumulator's names were refused


def _aggregate_names(d: Digest, acc_arity: int | None) -> _AggNames:
    group = d.names("groupBy") or ()
    select = d.names("select")
    if select is None:
        return _AggNames(None, None, "the description has no select list")
    calls = select[len(group):]
    names = [_column_name(c) for c in calls]
    key = group if all(_IDENT.match(g) for g in group) else None
    if any(n is None for n in names) or len(set(names)) != len(names):
        return _AggNames(key, None, f"aggregate calls without distinct names in "
                                    f"select=[{', '.join(select)}]")
    functions = []
    for c in calls:
        m = _CALL.match(c.strip())
        functions.append((m.group(1).upper(), bool(m.group(2))) if m else ("?", False))
    unknown = sorted({f for f, _ in functions if f not in _ONE_FIELD})
    if unknown:
        return _AggNames(key, None, f"the accumulator width of {', '.join(unknown)} is not "
                                    "known from the description")
    base = tuple(n for n in names if n is not None)
    views = tuple(f"{n}_distinct_view" for n, (_, distinct) in zip(base, functions, strict=True)
                  if distinct)
    retracting = any(f.endswith("_RETRACT") for f, _ in functions)
    layout = base + (("count1",) if retracting else ()) + views
    if acc_arity is not None and acc_arity != len(layout):
        return _AggNames(key, None, f"the accumulator has {acc_arity} fields, the description "
                                    f"names {len(layout)} ({', '.join(layout)})")
    return _AggNames(key, layout, None)


def _described_operators(job: Any) -> dict[tuple[int, str], list[tuple[str, Digest, bool]]]:
    """``(node id, kind) -> [(vertex id, digest, is the vertex's head)]`` over every vertex."""
    out: dict[tuple[int, str], list[tuple[str, Digest, bool]]] = {}
    for v in job.vertices:
        for i, d in enumerate(parse_description(v.description)):
            out.setdefault((d.node_id, d.kind), []).append((v.id, d, i == 0))
    return out


def _digest_of(op: Any, job: Any, described: dict[tuple[int, str], list[tuple[str, Digest, bool]]]
               ) -> tuple[Digest | None, str | None]:
    """The digest of one operator, or why there is none that can be trusted."""
    head = job.vertex(op.operator_id)
    head_digests = parse_description(head.description) if head is not None else []
    n = _NAME.match(op.name or "")
    if n is not None:
        kind, node_id = n.group(1), int(n.group(2))
        found = described.get((node_id, kind), [])
        if len(found) > 1:
            return None, (f"{len(found)} vertices describe {kind}[{node_id}]: ambiguous")
        if not found:
            return None, None
        vertex_id, digest, is_head = found[0]
        if head is not None and not (vertex_id == op.operator_id and is_head):
            return None, (f"vertex {op.operator_id} is headed by another operator than "
                          f"{op.name}: ambiguous")
        return digest, None
    if head_digests:  # no name in _metadata (older Flink): the vertex id is the head operator
        return head_digests[0], None
    return None, None


def apply_descriptions(meta: Any, job: Any) -> Any:
    """A :class:`~statequery.metadata.statemeta.StateMeta` whose group aggregations carry the
    query's column names read from the job graph's vertex descriptions (``job``, a
    :class:`~statequery.metadata.statemeta.JobInfo`), and whose operators without a name get
    their vertex's. States whose names were refused keep ``f0, f1, ...`` and say why in
    ``reason``."""
    from statequery.metadata.statemeta import assign_table_names

    described = _described_operators(job)
    ops = []
    renamed = False
    for op in meta.operators:
        vertex = job.vertex(op.operator_id)
        if not op.name and vertex is not None and vertex.name:
            op = replace(op, name=vertex.name,
                         states=tuple(replace(s, operator_name=vertex.name) for s in op.states))
            renamed = True
        digest, note = _digest_of(op, job, described)
        if digest is None or digest.kind not in _GROUP_AGG:
            if note is not None:
                op = _note(op, f"column names not taken from the vertex description: {note}")
            ops.append(op)
            continue
        ops.append(_name_aggregate(op, digest))
    # an operator named after its vertex (no name in _metadata) gets table names from it; the
    # others keep theirs (assignment is in _metadata order, as when the model was derived)
    return replace(meta, operators=assign_table_names(ops) if renamed else tuple(ops))


def _acc_arity(op: Any) -> int | None:
    for s in op.states:
        if s.name == "accState":
            spec = s.value_spec.inner if isinstance(s.value_spec, TtlSpec) else s.value_spec
            if isinstance(spec, RowDataSpec):
                return len(spec.type.fields)
    return None


def _note(op: Any, note: str) -> Any:
    states = []
    for s in op.states:
        # only decodable states with a value serializer (``reason`` is otherwise why a state
        # cannot be read, and a state without a value serializer reads ``reason`` as its error)
        if s.decodable and s.reason is None and "VALUE_SERIALIZER" in s.serializers:
            s = replace(s, reason=note)
        states.append(s)
    return replace(op, states=tuple(states))


def _name_aggregate(op: Any, digest: Digest) -> Any:
    names = _aggregate_names(digest, _acc_arity(op))
    key = _by_arity(names.key)
    acc = _by_arity(names.acc)

    def none(_: int) -> tuple[str, ...] | None:
        return None

    states = []
    for s in op.states:
        vc = acc if s.name == "accState" else none
        sers = dict(s.serializers)
        if "VALUE_SERIALIZER" in sers:
            sers["VALUE_SERIALIZER"] = _rename_value(sers["VALUE_SERIALIZER"], key, none, vc)
        s = replace(s, key_spec=_rename_rows(s.key_spec, key),
                    value_spec=_rename_value(s.value_spec, key, none, vc), serializers=sers)
        if s.name == "accState" and names.note is not None and s.reason is None:
            s = replace(s, reason="column names not taken from the vertex description: "
                                  + names.note)
        states.append(s)
    return replace(op, key_spec=_rename_rows(op.key_spec, key), states=tuple(states))
