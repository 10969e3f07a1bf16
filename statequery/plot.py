"""Key-group size histograms, the picture that shows skew (needs the ``plot`` extra:
matplotlib).

>>> from statequery.plot import plot_key_groups
>>> fig = plot_key_groups(sp.stats(), state="count")
>>> fig.savefig("count.png")
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError, MissingExtraError

if TYPE_CHECKING:
    from statequery.stats import StateStats

__all__ = ["plot_key_groups"]


def _figure(**kwargs: Any) -> Any:
    """A matplotlib ``Figure`` of its own: no pyplot, so no backend is chosen or changed (a
    notebook's inline backend stays as it is) and no figure is left open in pyplot's list."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtraError("statequery.plot", "matplotlib", "plot") from None
    fig: Any = Figure(**kwargs)
    # Jupyter shows the figure (a cell's last value) as a PNG, with or without %matplotlib
    fig._repr_png_ = functools.partial(_png, fig)
    return fig


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def plot_key_groups(
    stats: StateStats,
    state: str | None = None,
    operator: str | None = None,
    weight: str = "bytes",
    parallelism: int | None = None,
) -> Any:
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
