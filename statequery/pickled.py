"""Python values pickled by PyFlink, decoded without running code from the savepoint.

PyFlink stores ``Types.PICKLED_BYTE_ARRAY()`` values, undeclared ``key_by`` keys (and, in thread
mode, ``Types.ROW``/``Types.TUPLE`` state values) as Python pickles inside Java ``byte[]``
(``BytePrimitiveArraySerializer``): Flink records only "bytes" (docs/format-notes.md). A pickle is
a program: ``pickle.loads`` would import and call whatever it names. :func:`loads` unpickles with
a restricted ``find_class`` that allows only plain data: ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, ``bytearray``, ``tuple``, ``list``, ``dict``, ``set``,
``frozenset``, ``datetime`` (``date``, ``time``, ``datetime``, ``timedelta``, ``timezone``),
``decimal.Decimal``, ``collections.OrderedDict`` and PyFlink's ``Row`` (rebuilt here as
:class:`PyRow`; PyFlink is never imported). A pickle naming anything else (a user class, a
function) is not decoded: :class:`Refused` keeps its reason (the raw bytes stay where they were).

:func:`render` turns a decoded value into JSON text (the ``*_py`` columns of
:func:`add_python_columns`, docs/decoding.md).
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import io
import itertools
import json
import math
import pickle
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

__all__ = [
    "PyRow",
    "Refused",
    "PYTHON_COLUMNS",
    "add_python_columns",
    "holds_bytes",
    "is_pickle",
    "loads",
    "pickled_columns",
    "python_schema",
    "render",
]

#: the columns of a state's rows whose bytes may be a PyFlink pickle (when their type is bytes)
PYTHON_COLUMNS = ("key", "user_key", "value")

# Rendering bounds: a pickle can share one list many times (memo references), so a few hundred
# bytes can describe a value of 2**30 nodes; the renderer stops at these.
MAX_NODES = 100_000
MAX_DEPTH = 100
# Decoding bounds (beyond the pickle's size): containers nested deeper than MAX_DEPTH are not
# built; at most MAX_ITEMS values are put into containers; hashing dict keys and set elements
# visits at most MAX_HASH_WORK values, and one dict or set has at most MAX_EQUAL_HASHES keys of
# one hash value.
MAX_ITEMS = 1_000_000
MAX_HASH_WORK = 4_000_000
MAX_EQUAL_HASHES = 32
# The JSON text of one value is at most RENDER_FLOOR + RENDER_RATIO characters per byte of its
# pickle, and never over MAX_CHARS (a value shared by memo references renders once per
# reference: 120 KB of pickle could describe 10**9 characters).
MAX_CHARS = 8 * 2**20
RENDER_FLOOR = 4096
RENDER_RATIO = 64

ROW_KINDS = ("+I", "-U", "+U", "-D")


@dataclass(frozen=True)
class PyRow:
    """A PyFlink ``Row``: its field names (None when built positionally), values, row kind."""

    fields: tuple[str, ...] | None
    values: tuple[Any, ...]
    row_kind: str = "+I"


@dataclass(frozen=True)
class Refused:
    """Bytes that :func:`loads` did not decode, and why."""

    reason: str


class _Refusal(Exception):
    pass


class _RowKind(int):
    """Stand-in for ``pyflink.common.types.RowKind`` (an Enum of 0..3)."""


def _row_kind(value: Any) -> _RowKind:
    if not isinstance(value, int) or not 0 <= value < len(ROW_KINDS):
        raise _Refusal(f"RowKind({value!r}) is not a row kind")
    return _RowKind(value)


def _create_row(fields: Any, values: Any, row_kind: Any = None) -> PyRow:
    if fields is not None and not (
        isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields)
    ):
        raise _Refusal("Row field names that are not strings")
    if not isinstance(values, (list, tuple)):
        raise _Refusal("Row values that are not a tuple")
    kind = ROW_KINDS[row_kind] if isinstance(row_kind, _RowKind) else "+I"
    return PyRow(None if fields is None else tuple(fields), tuple(values), kind)


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Protocols 0-2 pickle ``bytes`` as ``_codecs.encode(text, 'latin1')``: only that."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Refusal("_codecs.encode other than text to latin1")
    return obj.encode("latin1")


def _bytearray(*args: Any) -> bytearray:
    """``bytearray`` of bytes or text (protocols 2 to 4 pickle one so), never of a size (a pickle
    of ``bytearray(10**12)`` is 20 bytes)."""
    if args and not isinstance(args[0], (bytes, str)):
        raise _Refusal("bytearray of other than bytes or text")
    return bytearray(*args)


# set, frozenset and OrderedDict are the unpickler's own (they hash what they are given)
_BUILTINS: dict[str, Callable[..., object]] = {
    "complex": complex,
    "bytearray": _bytearray,
}

_ALLOWED: dict[tuple[str, str], Callable[..., object]] = {
    **{("builtins", n): f for n, f in _BUILTINS.items()},
    **{("__builtin__", n): f for n, f in _BUILTINS.items()},
    ("_codecs", "encode"): _codecs_encode,
    **{("datetime", t.__name__): t
       for t in (dt.date, dt.time, dt.datetime, dt.timedelta, dt.timezone)},
    ("decimal", "Decimal"): decimal.Decimal,
    ("pyflink.common.types", "_create_row"): _create_row,
    ("pyflink.common.types", "RowKind"): _row_kind,
}


#: containers the unpickler builds and tracks (their depth, what hashing them costs)
_CONTAINERS = (tuple, list, dict, set, frozenset, PyRow)
_MUTABLE = (list, dict, set)


def _children(obj: Any) -> Iterable[Any] | None:
    """The values ``obj`` holds (None for a leaf: a number, text, bytes, a date ...)."""
    if isinstance(obj, (tuple, list, set, frozenset)):
        return obj
    if isinstance(obj, dict):
        return itertools.chain(obj.keys(), obj.values())
    if isinstance(obj, PyRow):
        return obj.values
    return None


class _Unpickler(pickle._Unpickler):
    """The pure-Python unpickler (an iterative loop over the opcodes, its memo a dict: a
    ``LONG_BINPUT`` of index 2**31 is one dict entry, where the C unpickler allocates a memo array
    of that size), with the opcodes that build containers replaced by bounded ones:

    - every container's nesting depth is known when it is built, and none deeper than
      :data:`MAX_DEPTH` is built (a container is never changed after it was put into another,
      so the depths stay exact, and no value holds itself);
    - a dict key or set element is hashed only after checking what hashing it costs (CPython's
      tuple hash recurses in C, and a tuple shared by memo references hashes as a tree): the
      hashing work of a pickle is bounded by :data:`MAX_HASH_WORK`, and the keys of one
      container with one hash value by :data:`MAX_EQUAL_HASHES` (no quadratic collisions);
    - at most :data:`MAX_ITEMS` values are put into containers, and as many memoized; MARKs
      nest no deeper than containers;
    - ``BUILD`` (setting an object's state) is refused: plain data never needs it.

    Every limit is a :class:`_Refusal`: a :class:`Refused` for that value alone."""

    dispatch = dict(pickle._Unpickler.dispatch)
    # what pickle._Unpickler.load sets (typeshed does not declare them)
    stack: list[Any]
    metastack: list[list[Any]]
    memo: dict[int, Any]
    append: Callable[[Any], None]
    read: Callable[[int], bytes]
    readinto: Callable[[bytearray], int]
    readline: Callable[[], bytes]
    if TYPE_CHECKING:
        def pop_mark(self) -> list[Any]: ...

    def __init__(self, file: io.BytesIO, size: int) -> None:
        super().__init__(file)
        self._size = size
        # id -> (the container, kept alive so that its id is not reused; depth; hash cost)
        self._shape: dict[int, tuple[Any, int, int]] = {}
        self._sealed: set[int] = set()
        self._hashes: dict[int, dict[int, int]] = {}
        self._hash_work = 0
        self._items = 0

    #: the names find_class resolves to this unpickler's own constructors
    _OWN = {
        **{(m, "set"): "_make_set" for m in ("builtins", "__builtin__")},
        **{(m, "frozenset"): "_make_frozenset" for m in ("builtins", "__builtin__")},
        ("collections", "OrderedDict"): "_make_ordered_dict",
    }

    def find_class(self, module: str, name: str) -> Any:
        own = self._OWN.get((module, name))
        if own is not None:
            return getattr(self, own)
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refusal(
                f"the pickle refers to {module}.{name}: only plain data is decoded "
                "(no code from a savepoint runs)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise _Refusal("the pickle has a persistent id")

    # -- the shape of what is built --------------------------------------------------------------

    def _shape_of(self, obj: Any) -> tuple[int, int]:
        """``(depth, hash cost)`` of ``obj``: 0 and 1 for a leaf."""
        got = self._shape.get(id(obj))
        if got is not None:
            return got[1], got[2]
        if isinstance(obj, _CONTAINERS):  # every container is registered when it is built
            raise _Refusal(f"a {type(obj).__name__} the unpickler did not build")
        return 0, 1

    def _register(self, obj: Any) -> Any:
        """Record a new container's depth and hash cost (from its values, registered before
        it); seal the mutable containers it holds."""
        children = _children(obj)
        if children is None:
            return obj
        depth, cost, n = 0, 1, 0
        sealed = self._sealed
        for c in children:
            d, k = self._shape_of(c)
            depth = max(depth, d)
            cost += k
            n += 1
            if isinstance(c, _MUTABLE):
                sealed.add(id(c))
        depth += 1
        if depth > MAX_DEPTH:
            raise _Refusal(f"the pickle nests deeper than {MAX_DEPTH}")
        self._count(n)
        if isinstance(obj, _MUTABLE):
            cost = 1  # hashing it fails at once
        elif isinstance(obj, frozenset):
            cost = 1 + n  # its elements' hashes are stored: no recursion
        elif isinstance(obj, PyRow):
            cost += 2 + len(obj.fields or ())
        self._shape[id(obj)] = (obj, depth, min(cost, 2 * MAX_HASH_WORK))
        return obj

    def _count(self, n: int) -> None:
        self._items += n
        if self._items > MAX_ITEMS:
            raise _Refusal(f"the pickle holds more than {MAX_ITEMS} values")

    def _check_keys(self, container: Any, keys: Iterable[Any]) -> None:
        """Before hashing ``keys`` into ``container`` (a registered dict or set, or None for a
        new one): the hashing work and the equal hashes."""
        counts = {} if container is None else self._hashes.setdefault(id(container), {})
        for key in keys:
            self._hash_work += self._shape_of(key)[1]
            if self._hash_work > MAX_HASH_WORK:
                raise _Refusal("the pickle's dict keys or set elements take too long to hash "
                               f"(over {MAX_HASH_WORK} values hashed)")
            h = hash(key)  # bounded now: depth <= MAX_DEPTH, cost counted
            n = counts.get(h, 0) + 1
            if n > MAX_EQUAL_HASHES:
                raise _Refusal(f"more than {MAX_EQUAL_HASHES} keys of one dict or set with one "
                               "hash value")
            counts[h] = n

    def _grow(self, container: Any, added: list[Any]) -> None:
        """Before adding ``added`` to a registered mutable ``container``."""
        if id(container) in self._sealed:
            raise _Refusal("the pickle changes a container after putting it into another (a "
                           "value that holds itself?): not plain data")
        depth, _ = self._shape_of(container)
        depth = max(depth, 1)
        sealed = self._sealed
        for c in added:
            if c is container:
                raise _Refusal("a container that holds itself")
            depth = max(depth, self._shape_of(c)[0] + 1)
            if isinstance(c, _MUTABLE):
                sealed.add(id(c))
        if depth > MAX_DEPTH:
            raise _Refusal(f"the pickle nests deeper than {MAX_DEPTH}")
        self._count(len(added))
        self._shape[id(container)] = (container, depth, 1)

    # -- constructors find_class gives (set, frozenset, OrderedDict hash what they get) -----------

    def _elements(self, args: tuple[Any, ...], what: str) -> list[Any]:
        if not args:
            return []
        if len(args) != 1 or not isinstance(args[0], (list, tuple, set, frozenset)):
            raise _Refusal(f"{what} of other than a list, tuple or set")
        return list(args[0])

    def _make_set(self, *args: Any) -> set[Any]:
        items = self._elements(args, "set")
        self._check_keys(None, items)
        return set(items)

    def _make_frozenset(self, *args: Any) -> frozenset[Any]:
        items = self._elements(args, "frozenset")
        self._check_keys(None, items)
        return frozenset(items)

    def _make_ordered_dict(self, *args: Any) -> collections.OrderedDict[Any, Any]:
        out: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        if args:
            arg = args[0]
            if len(args) != 1 or not isinstance(arg, (dict, list, tuple)):
                raise _Refusal("OrderedDict of other than a dict or a list of pairs")
            pairs = list(arg.items()) if isinstance(arg, dict) else list(arg)
            if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
                raise _Refusal("OrderedDict of other than (key, value) pairs")
            self._check_keys(None, [k for k, _ in pairs])
            out.update(pairs)
        return out

    # -- the opcodes that build containers ---------------------------------------------------------

    def _load_empty(self, value: Any) -> None:
        self.append(self._register(value))

    def load_empty_list(self) -> None:
        self._load_empty([])

    def load_empty_dict(self) -> None:
        self._load_empty({})

    def load_empty_set(self) -> None:
        self._load_empty(set())

    def load_empty_tuple(self) -> None:
        self._load_empty(())

    # (each pops the mark before self.append is looked up: pop_mark rebinds it)
    def load_list(self) -> None:
        items = self._register(list(self.pop_mark()))
        self.append(items)

    def load_tuple(self) -> None:
        items = self._register(tuple(self.pop_mark()))
        self.append(items)

    def _load_tuple_n(self, n: int) -> None:
        if len(self.stack) < n:
            raise pickle.UnpicklingError("a tuple of more values than the stack holds")
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.append(self._register(items))

    def load_tuple1(self) -> None:
        self._load_tuple_n(1)

    def load_tuple2(self) -> None:
        self._load_tuple_n(2)

    def load_tuple3(self) -> None:
        self._load_tuple_n(3)

    def load_dict(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise pickle.UnpicklingError("a dict of an odd number of values")
        self._check_keys(None, items[::2])
        out = self._register(dict(zip(items[::2], items[1::2], strict=True)))
        self.append(out)

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        self._check_keys(None, items)
        self.append(self._register(frozenset(items)))

    def load_append(self) -> None:
        value = self.stack.pop()
        self._add(self.stack[-1], [value])

    def load_appends(self) -> None:
        items = self.pop_mark()
        self._add(self.stack[-1], items)

    def _add(self, target: Any, items: list[Any]) -> None:
        if isinstance(target, list):
            self._grow(target, items)
            target.extend(items)
        elif isinstance(target, bytearray):
            target.extend(items)
        else:
            raise _Refusal(f"the pickle appends to a {type(target).__name__}")

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._set_items(self.stack[-1], [key, value])

    def load_setitems(self) -> None:
        items = self.pop_mark()
        self._set_items(self.stack[-1], items)

    def _set_items(self, target: Any, items: list[Any]) -> None:
        if not isinstance(target, dict):
            raise _Refusal(f"the pickle sets items of a {type(target).__name__}")
        if len(items) % 2:
            raise pickle.UnpicklingError("SETITEMS of an odd number of values")
        keys = items[::2]
        self._grow(target, items)
        self._check_keys(target, keys)
        target.update(zip(keys, items[1::2], strict=True))

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if not isinstance(target, set):
            raise _Refusal(f"the pickle adds set elements to a {type(target).__name__}")
        self._grow(target, items)
        self._check_keys(target, items)
        target.update(items)

    def load_mark(self) -> None:
        # a MARK opens the items of one container: pickles nest them as deep as their values
        if len(self.metastack) > MAX_DEPTH + 8:
            raise _Refusal(f"the pickle nests deeper than {MAX_DEPTH} (MARKs)")
        self.metastack.append(self.stack)
        self.stack = []
        self.append = self.stack.append

    def _memo_put(self, index: int) -> None:
        if index < 0:
            raise pickle.UnpicklingError(f"memo index {index}")
        if len(self.memo) >= MAX_ITEMS and index not in self.memo:
            raise _Refusal(f"the pickle memoizes more than {MAX_ITEMS} values")
        self.memo[index] = self.stack[-1]

    def load_put(self) -> None:
        self._memo_put(int(self.readline()[:-1]))

    def load_binput(self) -> None:
        self._memo_put(self.read(1)[0])

    def load_long_binput(self) -> None:
        self._memo_put(struct.unpack("<I", self.read(4))[0])

    def load_memoize(self) -> None:
        self._memo_put(len(self.memo))

    def load_build(self) -> None:
        raise _Refusal("the pickle sets an object's state (BUILD): not plain data")

    def load_bytearray8(self) -> None:
        (n,) = struct.unpack("<Q", self.read(8))
        if n > self._size:
            raise pickle.UnpicklingError(f"a bytearray of {n} bytes in a pickle of {self._size}")
        b = bytearray(n)
        self.readinto(b)
        self.append(b)



def _then_register(load: Callable[[Any], None]) -> Callable[[_Unpickler], None]:
    """An opcode that calls what the pickle names, then registers the object it made."""

    def run(self: _Unpickler) -> None:
        load(self)
        self.stack[-1] = self._register(self.stack[-1])

    return run


_OPS: dict[int, Any] = {  # dispatch is typed for pickle._Unpickler, not this subclass
    pickle.EMPTY_LIST[0]: _Unpickler.load_empty_list,
    pickle.EMPTY_DICT[0]: _Unpickler.load_empty_dict,
    pickle.EMPTY_SET[0]: _Unpickler.load_empty_set,
    pickle.EMPTY_TUPLE[0]: _Unpickler.load_empty_tuple,
    pickle.LIST[0]: _Unpickler.load_list,
    pickle.TUPLE[0]: _Unpickler.load_tuple,
    pickle.TUPLE1[0]: _Unpickler.load_tuple1,
    pickle.TUPLE2[0]: _Unpickler.load_tuple2,
    pickle.TUPLE3[0]: _Unpickler.load_tuple3,
    pickle.DICT[0]: _Unpickler.load_dict,
    pickle.FROZENSET[0]: _Unpickler.load_frozenset,
    pickle.APPEND[0]: _Unpickler.load_append,
    pickle.APPENDS[0]: _Unpickler.load_appends,
    pickle.SETITEM[0]: _Unpickler.load_setitem,
    pickle.SETITEMS[0]: _Unpickler.load_setitems,
    pickle.ADDITEMS[0]: _Unpickler.load_additems,
    pickle.BUILD[0]: _Unpickler.load_build,
    pickle.MARK[0]: _Unpickler.load_mark,
    pickle.PUT[0]: _Unpickler.load_put,
    pickle.BINPUT[0]: _Unpickler.load_binput,
    pickle.LONG_BINPUT[0]: _Unpickler.load_long_binput,
    pickle.MEMOIZE[0]: _Unpickler.load_memoize,
    pickle.BYTEARRAY8[0]: _Unpickler.load_bytearray8,
    **{op[0]: _then_register(pickle._Unpickler.dispatch[op[0]])
       for op in (pickle.REDUCE, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.INST, pickle.OBJ)},
}
_Unpickler.dispatch.update(_OPS)


def is_pickle(data: bytes) -> bool:
    """Whether ``data`` starts like a pickle of protocol 2 to 5 (the PROTO opcode) and ends with
    STOP: what ``pickle.dumps`` and ``cloudpickle.dumps`` write."""
    return len(data) >= 3 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1:] == b"."


def loads(data: bytes) -> Any:
    """The Python value pickled in ``data`` (a pickle, or as PyFlink's process mode stores one:
    int32 length + pickle), or a :class:`Refused` saying why not (not a pickle, a class or
    function other than the plain data types above, bytes after the end)."""
    if not is_pickle(data) and len(data) > 4 and int.from_bytes(data[:4], "big") == len(data) - 4:
        data = data[4:]  # process mode's pickled coder: int32 length + the pickle
    if not is_pickle(data):
        return Refused("not a pickle (protocol 2 to 5)")
    stream = io.BytesIO(data)
    try:
        value = _Unpickler(stream, len(data)).load()
    except _Refusal as e:
        return Refused(str(e))
    except RecursionError:  # not expected: the unpickler is a loop and bounds the depth
        return Refused("the pickle nests too deep")
    except MemoryError:
        return Refused("the pickle does not fit in memory")
    except Exception as e:  # a damaged pickle: any error of the unpickler (never code of ours)
        return Refused(f"not a valid pickle: {type(e).__name__}: {e}")
    if stream.tell() != len(data):
        return Refused(f"{len(data) - stream.tell()} bytes after the pickle's end")
    return value


class _TooLarge(Exception):
    pass


_encode_str = json.encoder.encode_basestring  # JSON text of a str (ensure_ascii=False)


class _Budget:
    """What rendering one value may still produce: values and characters of JSON text."""

    __slots__ = ("chars", "max_chars", "nodes")

    def __init__(self, max_chars: int) -> None:
        self.nodes = MAX_NODES
        self.chars = self.max_chars = max_chars

    def spend(self, n: int) -> None:
        self.chars -= n
        if self.chars < 0:
            raise _TooLarge(f"more than {self.max_chars} characters of JSON")


def _json(value: Any, budget: _Budget, depth: int) -> Any:
    """``value`` as what ``json.dumps`` turns into its JSON text, counting that text's
    characters (an upper bound) into ``budget`` before building each piece."""
    budget.nodes -= 1
    if budget.nodes < 0:
        raise _TooLarge(f"more than {MAX_NODES} values")
    if depth > MAX_DEPTH:
        raise _TooLarge(f"nested deeper than {MAX_DEPTH}")
    budget.spend(1)  # the separator after it
    if value is None or isinstance(value, bool):
        budget.spend(5)
        return value
    if isinstance(value, str):
        budget.spend(len(value) + 2)  # before the escaped copy is made
        budget.spend(len(_encode_str(value)) - len(value) - 2)
        return value
    if isinstance(value, int):
        if value.bit_length() > 10_000:  # JSON text of over 3000 digits (Python caps int str)
            raise _TooLarge(f"an integer of {value.bit_length()} bits")
        budget.spend(len(str(value)))
        return int(value)
    if isinstance(value, float):
        budget.spend(len(repr(value)) + 2)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, (bytes, bytearray)):
        budget.spend(4 * ((len(value) + 2) // 3) + 13)
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, complex):
        budget.spend(14)
        return {"$complex": [_json(value.real, budget, depth + 1),
                             _json(value.imag, budget, depth + 1)]}
    if isinstance(value, (decimal.Decimal, dt.date, dt.time, dt.datetime, dt.timezone)):
        text = value.isoformat() if isinstance(value, (dt.date, dt.time)) else str(value)
        budget.spend(len(text) + 2)
        return text
    if isinstance(value, dt.timedelta):
        budget.spend(len(str(value.days)) + 32)
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, PyRow):
        budget.spend(2 + (0 if value.row_kind == "+I" else 25))
        items = [_json(v, budget, depth + 1) for v in value.values]
        if value.fields is not None and len(value.fields) == len(items):
            for f in value.fields:
                budget.spend(len(_encode_str(f)) + 1)
            out: Any = dict(zip(value.fields, items, strict=True))
        else:
            out = items
        return out if value.row_kind == "+I" else {"$row_kind": value.row_kind, "row": out}
    if isinstance(value, (list, tuple)):
        budget.spend(2)
        return [_json(v, budget, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        budget.spend(2)
        items = [_json(v, budget, depth + 1) for v in value]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True, ensure_ascii=False))
    if isinstance(value, dict):
        budget.spend(2)
        if all(isinstance(k, str) for k in value):
            out = {}
            for k, v in value.items():
                budget.spend(len(_encode_str(k)) + 1)
                out[k] = _json(v, budget, depth + 1)
            return out
        budget.spend(19 * len(value))  # {"key":,"value":}
        return [{"key": _json(k, budget, depth + 1), "value": _json(v, budget, depth + 1)}
                for k, v in value.items()]
    raise _TooLarge(f"a {type(value).__name__}")  # not reached: loads returns only the above


def render(value: Any, max_chars: int = MAX_CHARS) -> tuple[str | None, str | None]:
    """``(json, reason)``: a decoded value as JSON text (tuples and sets as arrays, sets sorted,
    dicts with other than string keys as ``[{"key", "value"}]``, bytes ``{"$bytes": base64}``,
    decimals strings, dates/times ISO 8601, a Row an object of its fields, or an array when it
    has no field names), or ``(None, reason)`` for a :class:`Refused` or a value too large (more
    than :data:`MAX_NODES` values, nested deeper than :data:`MAX_DEPTH`, or JSON text of more
    than ``max_chars`` characters: counted while rendering, before the text is built)."""
    if isinstance(value, Refused):
        return None, value.reason
    try:
        out = _json(value, _Budget(max_chars), 0)
    except _TooLarge as e:
        return None, f"too large to render: {e}"
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")), None


def render_budget(size: int) -> int:
    """The characters of JSON text a pickle of ``size`` bytes may render to."""
    return min(MAX_CHARS, RENDER_FLOOR + RENDER_RATIO * size)


def _render_bytes(data: bytes | None) -> tuple[str | None, str | None]:
    if data is None:
        return None, None
    try:
        return render(loads(data), render_budget(len(data)))
    except Exception as e:  # noqa: BLE001 - one value's failure never breaks the table's read
        return None, f"not rendered: {type(e).__name__}: {e}"


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def holds_bytes(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` holds bytes a PyFlink job may have pickled into: binary, a
    list of binaries, or a one-field struct of a binary (PyFlink's key ``ROW<f0 BYTES>``)."""
    if _is_binary(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _is_binary(t.value_type)
    return pa.types.is_struct(t) and t.num_fields == 1 and _is_binary(t.field(0).type)


def pickled_columns(schema: pa.Schema) -> list[str]:
    """The columns of :data:`PYTHON_COLUMNS` in ``schema`` that hold bytes (:func:`holds_bytes`):
    those ``pickled`` renders. From the types alone: whether the bytes are pickles is known only
    by reading them."""
    return [n for n in PYTHON_COLUMNS if n in schema.names and holds_bytes(schema.field(n).type)]


def python_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ``<column>_py`` and ``<column>_py_reason`` (strings) after each column of
    :func:`pickled_columns`: the schema of a ``pickled`` read (it depends on the types only)."""
    for name in pickled_columns(schema):
        at = schema.get_field_index(name) + 1
        schema = schema.insert(at, pa.field(f"{name}_py", pa.string()))
        schema = schema.insert(at + 1, pa.field(f"{name}_py_reason", pa.string()))
    return schema


def _python_column(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """The JSON and reason columns of a column of :func:`holds_bytes`: binary, a list of binaries
    (each element decoded, the JSON an array), or a one-field struct of a binary."""
    t = col.type
    values = col.to_pylist()
    pairs: list[tuple[str | None, str | None]]
    if _is_binary(t):
        pairs = [_render_bytes(v) for v in values]
    elif pa.types.is_struct(t):
        name = t.field(0).name
        pairs = [(None, None) if v is None else _render_bytes(v[name]) for v in values]
    else:
        pairs = []
        for elements in values:
            if elements is None:
                pairs.append((None, None))
                continue
            rendered = [_render_bytes(e) for e in elements]
            reasons = [f"element {i}: {r}" for i, (_, r) in enumerate(rendered) if r]
            texts = ["null" if j is None else j for j, _ in rendered]
            pairs.append(("[" + ",".join(texts) + "]", "; ".join(reasons) or None))
    return (pa.array([p[0] for p in pairs], pa.string()),
            pa.array([p[1] for p in pairs], pa.string()))


def add_python_columns(table: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
    """``table`` (a Table or a RecordBatch) with, after each column of :func:`pickled_columns`
    (key, user_key, value of a bytes type: binary, a list of binaries, PyFlink's one-field key
    row of bytes), ``<column>_py``: the pickled Python value as JSON text (:func:`render`), and
    ``<column>_py_reason``: why it is null where the bytes are not null (not a pickle, a class
    outside plain data, too large). The raw bytes stay in ``<column>``; the schema is
    :func:`python_schema` of ``table``'s."""
    for name in pickled_columns(table.schema):
        json_col, reason_col = _python_column(table.column(name))
        at = table.schema.get_field_index(name) + 1
        table = table.add_column(at, pa.field(f"{name}_py", pa.string()), json_col)
        table = table.add_column(at + 1, pa.field(f"{name}_py_reason", pa.string()), reason_col)
    return table
