"""Hostile pickles (issue 31 item 4), built opcode by opcode: each one crashed, stalled or ate
gigabytes in the C unpickler or the renderer behind ``pickled=True``. Imported by the tests and
by the subprocesses they run the attacks in (a crash there is a failed test, not a dead run)."""

from __future__ import annotations

import pickle
from collections.abc import Callable

PROTO = b"\x80\x04"


def deep_tuple_key(depth: int = 10**6) -> bytes:
    """{((((...),),),): None}: a tuple nested ``depth`` deep used as a dict key (hashing it
    recursed in C: a segmentation fault)."""
    return PROTO + b"}" + b")" + b"\x85" * depth + b"Ns."


def deep_tuple_in_frozenset(depth: int = 10**6) -> bytes:
    """frozenset({((((...),),),)}): the same tuple as a frozenset element."""
    return PROTO + b"(" + b")" + b"\x85" * depth + b"\x91."


def memo_index(index: int = 2**27) -> bytes:
    """None stored at memo index ``index`` (LONG_BINPUT): 9 bytes; the C unpickler allocated a
    memo array of 2 * index entries (2.1 GB for 2**27)."""
    return PROTO + b"N" + b"r" + index.to_bytes(4, "little") + b"."


def huge_bytearray(size: int = 2**40) -> bytes:
    """BYTEARRAY8 of ``size`` bytes in a pickle of 13."""
    return b"\x80\x05\x96" + size.to_bytes(8, "little") + b"."


def shared_text(chars: int = 100_000, refs: int = 10_000) -> bytes:
    """A list of ``refs`` memo references to one text of ``chars`` characters: 120 KB of
    pickle, 10**9 characters of JSON (1.96 GB rendered)."""
    text = b"x" * chars
    return (PROTO + b"](" + b"\x8d" + len(text).to_bytes(8, "little") + text + b"\x94"
            + b"h\x00" * (refs - 1) + b"e.")


def tuple_dag_key(levels: int = 25) -> bytes:
    """t = (t, t) ``levels`` times (DUP, TUPLE2), as a dict key: 60 bytes whose hash visits
    2**levels tuples (tuples do not cache their hash)."""
    return PROTO + b"}" + b")" + b"2\x86" * levels + b"Ns."


def colliding_keys(n: int = 200) -> bytes:
    """A dict of ``n`` int keys of one hash value (multiples of 2**61 - 1): every insertion
    compares with all the keys before it (quadratic)."""
    return pickle.dumps({i * (2**61 - 1): None for i in range(1, n + 1)}, 4)


def build_on_row() -> bytes:
    """A PyFlink Row whose state is then set (BUILD {'values': 5}): an untyped TypeError when
    rendered, which broke the pickled read of the whole table."""
    row = (b"\x8c\x14pyflink.common.types\x8c\x0b_create_row\x93" + b"N)\x86R")
    return PROTO + row + b"}\x8c\x06valuesK\x05sb."


def deep_list(depth: int = 200) -> bytes:
    """[[[...]]]: lists nested ``depth`` + 1 deep, the innermost built first (MARK ... LIST)."""
    return PROTO + b"(" * depth + b"]" + b"l" * depth + b"."


def many_values(n: int = 1_200_000) -> bytes:
    """A list of ``n`` Nones from a pickle of about ``n`` bytes (DUP)."""
    return PROTO + b"](N" + b"2" * (n - 1) + b"e."


def many_memo_entries(n: int = 1_200_000) -> bytes:
    """None memoized ``n`` times (MEMOIZE, one byte each): a memo entry per byte."""
    return PROTO + b"N" + b"\x94" * n + b"."


def open_marks(n: int = 200) -> bytes:
    """``n`` MARKs never closed (each keeps a stack aside)."""
    return PROTO + b"(" * n + b"N."


ATTACKS: dict[str, Callable[[], bytes]] = {
    "deep_tuple_key": deep_tuple_key,
    "deep_tuple_in_frozenset": deep_tuple_in_frozenset,
    "memo_index": memo_index,
    "huge_bytearray": huge_bytearray,
    "shared_text": shared_text,
    "tuple_dag_key": tuple_dag_key,
    "colliding_keys": colliding_keys,
    "build_on_row": build_on_row,
    "deep_list": deep_list,
    "many_values": many_values,
    "many_memo_entries": many_memo_entries,
    "open_marks": open_marks,
}
