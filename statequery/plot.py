"""Key-group size histograms, the picture that shows skew, and one key's values through a
job's versions (needs the ``plot`` extra: matplotlib).

>>> from statequery.plot import plot_key_groups, plot_history
>>> fig = plot_key_groups(sp.stats(), state="count")
>>> fig.savefig("count.png")
>>> fig = plot_history(statequery.open_job(DIR).history("user-3"))
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError, MissingExtraError

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.figure import Figure

    from statequery.stats import StateStats

__all__ = ["plot_history", "plot_key_groups"]


def _figure(**kwargs: Any) -> Figure:
    """A matplotlib ``Figure`` of its own: no pyplot, so no backend is chosen or changed (a
    notebook's inline backend stays as it is) and no figure is left open in pyplot's list."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtraError("statequery.plot", "matplotlib", "plot") from None
    fig = Figure(**kwargs)
    # Jupyter shows the figure (a cell's last value) as a PNG, with or without %matplotlib
    fig._repr_png_ = functools.partial(_png, fig)  # type: ignore[attr-defined]
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def plot_key_groups(
    stats: StateStats,
    state: str | None = None,
    operator: str | None = None,
    weight: str = "bytes",
    parallelism: int | None = None,
) -> Figure:
    """A matplotlib Figure per keyed state (or the one named): a bar per key group (``bytes``,
    ``entries`` or ``distinct_keys``), coloured by the subtask that owns it, and the per-subtask
    totals beside it (at ``parallelism`` if given, else the snapshot's)."""
    from statequery.stats import subtask_of

    if weight not in ("bytes", "entries", "distinct_keys"):
        raise InvalidOptionError(f"weight must be bytes, entries or distinct_keys, not {weight!r}")
    rows = [
        r for r in stats.table.to_pylist()
        if r["key_group"] is not None
        and (state is None or r["state"] == state)
        and (operator is None or operator in (r["operator"], r["operator_id"]))
    ]
    if not rows:
        raise InvalidOptionError(
            f"no keyed state {state or ''!r} with data in these statistics"
        )
    states = sorted({(r["operator_id"], r["operator"], r["state"]) for r in rows},
                    key=lambda t: (t[1], t[2]))
    if weight == "bytes" and any(r["bytes"] is None for r in rows):
        weight = "entries"  # heap layout: no byte figures
    fig = _figure(figsize=(11, 2.6 * len(states)))
    axes = fig.subplots(len(states), 2, squeeze=False, gridspec_kw={"width_ratios": [4, 1]})
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    for (op_id, op_label, name), (ax, ax_sub) in zip(states, axes, strict=True):
        mine = [r for r in rows if r["operator_id"] == op_id and r["state"] == name]
        maxp = stats.max_parallelism[(op_id, name)]
        par = parallelism or stats.parallelism[(op_id, name)]
        owners = [subtask_of(r["key_group"], maxp, par) for r in mine]
        ax.bar(
            [r["key_group"] for r in mine], [r[weight] for r in mine], width=1.0,
            color=[cmap(o % 10) for o in owners],
        )
        ax.set_xlim(-0.5, maxp - 0.5)
        ax.set_title(f"{op_label} / {name}: {weight} per key group", fontsize=10)
        ax.set_xlabel("key group")
        ax.set_ylabel(weight)
        per = [0] * par
        for r, o in zip(mine, owners, strict=True):
            per[o] += r[weight]
        ax_sub.bar(range(par), per, color=[cmap(i % 10) for i in range(par)])
        ax_sub.set_xticks(range(par))
        ax_sub.set_title(f"per subtask (parallelism {par})", fontsize=10)
        ax_sub.set_xlabel("subtask")
    fig.tight_layout()
    return fig


def _number(text: str | None) -> float | None:
    """A history value (JSON text) as a number, None when it is not one (TTL values: theirs)."""
    import json

    if text is None:
        return None
    value = json.loads(text)
    if isinstance(value, dict) and set(value) == {"value", "last_access"}:
        value = value["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def plot_history(history: pa.Table) -> Figure:
    """A matplotlib Figure of :meth:`statequery.history.Job.history`'s table: one plot per state
    whose values are numbers, a line per entry (namespace, user key) over the versions'
    checkpoint ids (a version without the entry: a gap)."""
    rows = history.to_pylist()
    series: dict[tuple[str, str], dict[str, dict[int, float | None]]] = {}
    numeric: set[tuple[str, str]] = set()
    for r in rows:
        state = (r["operator"], r["state"])
        label = ", ".join(
            x for x in (r["namespace"] if r["namespace"] != "null" else None, r["user_key"])
            if x is not None
        ) or "value"
        n = _number(r["value"])
        if n is not None:
            numeric.add(state)
        series.setdefault(state, {}).setdefault(label, {})[r["checkpoint_id"]] = n
    states = sorted(s for s in series if s in numeric)
    if not states:
        raise InvalidOptionError("no state of this history holds numbers to plot")
    versions = sorted({r["checkpoint_id"] for r in rows})
    fig = _figure(figsize=(9, 2.6 * len(states)))
    axes = fig.subplots(len(states), 1, squeeze=False)
    for (op_label, name), (ax,) in zip(states, axes, strict=True):
        for label, points in sorted(series[(op_label, name)].items()):
            ax.plot(versions, [points.get(v) for v in versions], marker="o", label=label)
        ax.set_title(f"{op_label} / {name}", fontsize=10)
        ax.set_xlabel("checkpoint id")
        if len(series[(op_label, name)]) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
