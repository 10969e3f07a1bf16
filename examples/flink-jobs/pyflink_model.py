"""Input and model of the PyFlink fixture job (pyflink_job.py); imported by the job (shipped to
its Python workers with ``add_python_file``) and by generate_fixtures.py (expected contents).

Events ``i = 0..59``: ``user = "user-" + (i % 6)``, ``amount = (i * 37) % 101``,
``ts = TS_BASE + i * 60_000`` (event time, one hour apart every 60 events).
"""

from __future__ import annotations

import datetime as dt
import decimal

N_EVENTS = 60
N_USERS = 6
CATEGORIES = ["books", "games", "music"]
TS_BASE = 1_700_000_000_000
TIMER_BASE = 4102444800000
HOUR_MS = 3_600_000
RULES = [("books", "discount-10"), ("games", ""), ("music", "\U0001F3B5 none")]

# states the job does not write in thread mode (pyflink_job.py says why)
THREAD_SKIPPED = ("tags", "ts")
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


class Point:
    """A user class: its instances are pickled by reference (module pyflink_model, class Point)."""

    def __init__(self, x: int, y: int) -> None:
        self.x = x
        self.y = y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


def event(i: int) -> tuple[int, str, int, int]:
    return i, f"user-{i % N_USERS}", (i * 37) % 101, TS_BASE + i * 60_000


def user_index(user: str) -> int:
    return int(user.rsplit("-", 1)[1])


def category(i: int) -> str:
    return CATEGORIES[(i // N_USERS) % len(CATEGORIES)]


def label(u: int) -> str:
    """Edge strings: empty, non-BMP, NUL and a lone ASCII."""
    return ["", "\U0001F600 smile", "a\x00b", "x", "caf\u00e9", "\u4e2d\u6587"][u]


def last_text(i: int) -> str | None:
    """None for every event of an even user (a null string field in a ROW)."""
    return None if (i % N_USERS) % 2 == 0 else f"event-{i}"


def city(u: int) -> str:
    return f"city-{u % 3}"


def zip_code(u: int) -> int:
    return 10000 + u


def dec(u: int) -> decimal.Decimal:
    return decimal.Decimal(f"{u}.{u:02d}") * (-1 if u % 2 else 1) + decimal.Decimal("1e20")


def sql_ts(u: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, 0, 0, 0) + dt.timedelta(days=u, microseconds=123456 + u)


def tags(u: int) -> list[str]:
    return [f"t{j}" for j in range(u % 3)]


def attrs(u: int) -> dict[str, int]:
    return {f"k{j}": j * u for j in range(u % 3)} | ({"": LONG_MIN} if u == 0 else {})


def extremes(u: int) -> tuple:
    return (LONG_MIN, LONG_MAX, INT_MIN, INT_MAX, 1.5 * u, "\U0010FFFF" * (u % 2), None)


def blob(u: int):
    """The pickled value state: a dict with nested plain data, or (users 4, 5) a user class."""
    if u >= 4:
        return Point(u, -u)
    return {"u": u, "name": f"user-{u}", "pair": (u, str(u)), "set": {u, u + 1},
            "none": None, "f": u / 4, "b": bytes([u, 255]), "big": 2**70 + u,
            "when": dt.date(2024, 1, 1 + u)}


def blob_appended(i: int) -> bool:
    return i < 2 * N_USERS


def blobs_element(i: int):
    return ("event", i, [i, i + 1], {"t": category(i)})


# --------------------------------------------------------------------------------------------
# The model: the state after every event
# --------------------------------------------------------------------------------------------


def typed_state() -> dict[str, dict]:
    """user -> state name -> value, as Python values."""
    out: dict[str, dict] = {}
    for i in range(N_EVENTS):
        _, user, amount, _ = event(i)
        u = user_index(user)
        s = out.setdefault(user, {"count": 0, "recent": [], "detail-by-category": {}, "sum": 0,
                                  "avg": [0, 0], "blobs": []})
        s["count"] += 1
        s["label"] = label(u)
        s["recent"].append(amount)
        cat = category(i)
        old = s["detail-by-category"].get(cat)
        total = (old["total"] if old else 0) + amount
        s["detail-by-category"][cat] = {"total": total, "last": last_text(i),
                                        "where": {"city": city(u), "zip": zip_code(u)}}
        s["sum"] += amount
        s["avg"] = [s["avg"][0] + amount, s["avg"][1] + 1]
        s["dec"] = dec(u)
        s["ts"] = sql_ts(u)
        s["tags"] = tags(u)
        s["attrs"] = attrs(u)
        s["extremes"] = extremes(u)
        s["blob"] = blob(u)
        if blob_appended(i):
            s["blobs"].append(blobs_element(i))
    return out


def pair_counts() -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for i in range(N_EVENTS):
        k = (event(i)[1], i % 2)
        out[k] = out.get(k, 0) + 1
    return out


def window_sums() -> dict[tuple[str, int], tuple]:
    """(user, window start) -> the reduced event (i of the first, user, sum, max ts)."""
    out: dict[tuple[str, int], tuple] = {}
    for i in range(N_EVENTS):
        e = event(i)
        start = e[3] - e[3] % HOUR_MS
        k = (e[1], start)
        a = out.get(k)
        out[k] = e if a is None else (a[0], a[1], a[2] + e[2], max(a[3], e[3]))
    return out
