"""State-file headers: ``KeyedBackendSerializationProxy`` and ``OperatorBackendSerializationProxy``.

Keyed header (``KeyedBackendSerializationProxy``, version 6 in Flink 1.15-2.3)::

    int32 version, bool compressed, TopLevelSnapshot keySerializer,
    int16 numStates × StateMetaInfoSnapshot

Operator header (``OperatorBackendSerializationProxy``, version 5 in 1.15-1.18, 6 since 1.19)::

    int32 version, [v >= 6] bool compressed,
    int16 n × StateMetaInfoSnapshot (OPERATOR), [v >= 3] int16 n × StateMetaInfoSnapshot (BROADCAST)

``StateMetaInfoSnapshot`` (``StateMetaInfoSnapshotReadersWriters``, meta-info v6/v7)::

    UTF name, int32 backendStateType (ordinal), int32 n × (UTF key, UTF value) options,
    int32 n × (UTF key, TopLevelSnapshot) serializers

Snapshot payloads are not length-prefixed, so an unknown snapshot class hides where the rest of
the header starts. The readers then *resynchronise*: they look for the next serializer entry or
state record after the unknown payload and accept a candidate position only if the complete rest
of the header parses from there. The state with the unknown class is listed as not decodable with
the reason; if no position works, the states that could not be read are reported as lost.

:func:`read_header` reads a header from a stream handle through the storage seam, fetching only a
bounded prefix of the file and growing it while the header runs past it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, UnknownSerializerError, UnsupportedFormatError
from statequery.metadata.handles import HandleResolver, StreamHandle
from statequery.metadata.state import StateInfo
from statequery.serializers.snapshots import read_top_level_snapshot
from statequery.serializers.spec import (
    ROW_KIND_STATES,
    OpaqueSpec,
    SerializerSpec,
    with_row_kinds,
)

__all__ = [
    "BACKEND_STATE_TYPES",
    "KeyedBackendProxy",
    "OperatorBackendProxy",
    "read_header",
    "read_header_bytes",
    "read_keyed_proxy",
    "read_operator_proxy",
]

KEYED_PROXY_VERSION = 6
OPERATOR_PROXY_VERSIONS = (5, 6)
BACKEND_STATE_TYPES = ("KEY_VALUE", "OPERATOR", "BROADCAST", "PRIORITY_QUEUE", "KEY_VALUE_V2")
SERIALIZER_KEYS = (
    "NAMESPACE_SERIALIZER",
    "VALUE_SERIALIZER",
    "KEY_SERIALIZER",
    "USER_KEY_SERIALIZER",
)
OPTION_KEYS = ("KEYED_STATE_TYPE", "OPERATOR_STATE_DISTRIBUTION_MODE")
MAX_OPTIONS = 64
MAX_SERIALIZERS = 16
RESYNC_WINDOW = 4 << 20  # bytes searched for the end of an unknown snapshot payload


@dataclass(frozen=True)
class KeyedBackendProxy:
    """A keyed-state header. ``header_end`` is the offset where key-group data may begin (None
    when an unknown serializer made the end unknowable)."""

    version: int
    compressed: bool
    key_serializer: SerializerSpec
    states: tuple[StateInfo, ...]
    header_end: int | None
    error: str | None = None  # the part of the header that could not be read, if any
    #: of a type-12 key-groups stream whose every key group has an offset: "heap" or
    #: "canonical" as its bytes say (metadata.handles.layout_by_first_bytes); else None
    layout: str | None = None

    def state(self, name: str) -> StateInfo | None:
        for s in self.states:
            if s.name == name:
                return s
        return None


@dataclass(frozen=True)
class OperatorBackendProxy:
    """An operator-state header: list/union states and broadcast states."""

    version: int
    compressed: bool
    operator_states: tuple[StateInfo, ...]
    broadcast_states: tuple[StateInfo, ...]
    header_end: int | None
    error: str | None = None

    @property
    def states(self) -> tuple[StateInfo, ...]:
        return self.operator_states + self.broadcast_states


# -- state meta info ---------------------------------------------------------------------------


class _Unknown(Exception):
    """An unknown snapshot inside a state's serializers (carries what was read so far)."""

    def __init__(
        self, error: UnknownSerializerError, partial: StateInfo, remaining: int, resume: int
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.partial = partial
        self.remaining = remaining  # serializer entries after the failing one
        self.resume = resume  # position after the failing entry's key and proxy version


def _read_state_meta(d: Decoder, state_id: int) -> StateInfo:
    pos = d.pos
    name = d.read_utf()
    tpos = d.pos
    code = d.read_int()
    if not 0 <= code < len(BACKEND_STATE_TYPES):
        raise d.error(f"state {name!r}: unknown backend state type {code}", tpos)
    backend_type = BACKEND_STATE_TYPES[code]
    npos = d.pos
    n_options = d.read_int()
    if not 0 <= n_options <= MAX_OPTIONS:
        raise d.error(f"state {name!r}: {n_options} options", npos)
    options = {}
    for _ in range(n_options):
        k = d.read_utf()
        options[k] = d.read_utf()
    npos = d.pos
    n_ser = d.read_int()
    if not 0 <= n_ser <= MAX_SERIALIZERS:
        raise d.error(f"state {name!r}: {n_ser} serializers", npos)
    serializers: dict[str, SerializerSpec] = {}
    for i in range(n_ser):
        key = d.read_utf()
        entry = d.pos
        try:
            serializers[key] = read_top_level_snapshot(d)
        except UnknownSerializerError as e:
            serializers[key] = OpaqueSpec(
                snapshot_class=e.class_name, family="unknown", reason=str(e)
            )
            partial = StateInfo.from_header(
                name, backend_type, options, serializers, state_id, f"{key}: {e}"
            )
            raise _Unknown(e, partial, n_ser - i - 1, entry + 4) from e
    del pos
    if (name in ROW_KIND_STATES and backend_type.startswith("KEY_VALUE")
            and "VALUE_SERIALIZER" in serializers):
        serializers["VALUE_SERIALIZER"] = with_row_kinds(serializers["VALUE_SERIALIZER"])
    return StateInfo.from_header(name, backend_type, options, serializers, state_id)


T = TypeVar("T")


def _try(parse: Callable[[Decoder], T], d: Decoder, pos: int) -> tuple[T, int] | None:
    probe = Decoder(d.buf, pos, d.end, d.source, d.base_offset)
    try:
        return parse(probe), probe.pos
    except (CorruptStateError, UnknownSerializerError, _Unknown, UnsupportedFormatError):
        return None


def _utf_bytes(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


_SER_PATTERNS = tuple(_utf_bytes(k) + b"\x00\x00\x00\x02" for k in SERIALIZER_KEYS)
_OPT_PATTERNS = tuple(_utf_bytes(k) for k in OPTION_KEYS)


def _candidates(buf: bytes, start: int, end: int) -> list[tuple[int, str]]:
    """Positions after ``start`` where a serializer entry or a state record may begin."""
    limit = min(end, start + RESYNC_WINDOW)
    out: set[tuple[int, str]] = set()
    window = bytes(buf[start:limit])
    for pat in _SER_PATTERNS:
        i = window.find(pat)
        while i >= 0:
            m = start + i
            out.add((m, "ser"))
            # a state without options (timers): name, type, 0 options, 1..n serializers, key
            _state_starts(buf, m - 12, start, out, (3, 0, 4))
            i = window.find(pat, i + 1)
    for pat in _OPT_PATTERNS:
        i = window.find(pat)
        while i >= 0:
            _state_starts(buf, start + i - 8, start, out, None)
            i = window.find(pat, i + 1)
    return sorted(out)


def _state_starts(
    buf: bytes,
    type_pos: int,
    lo: int,
    out: set[tuple[int, str]],
    _hint: tuple[int, int, int] | None,
) -> None:
    """Add positions ``q`` with ``u16 len`` at q such that the name ends exactly at ``type_pos``."""
    if type_pos - 2 < lo:
        return
    for length in range(0, min(type_pos - 2 - lo, 65535) + 1):
        q = type_pos - 2 - length
        if int.from_bytes(bytes(buf[q : q + 2]), "big") == length:
            out.add((q, "state"))


def _read_states(
    d: Decoder, n: int, first_id: int, what: str
) -> tuple[list[StateInfo], str | None, bool]:
    """Read ``n`` states, resynchronising after unknown serializer snapshots.

    Returns the states, an error naming what could not be read (None if all states were read),
    and whether the decoder now stands exactly at the end of the states.
    """
    states: list[StateInfo] = []
    for i in range(n):
        try:
            states.append(_read_state_meta(d, first_id + i))
            continue
        except _Unknown as u:
            unknown = u
        states.append(unknown.partial)
        left = n - i - 1
        if unknown.remaining == 0 and left == 0:
            return states, None, False  # the unknown payload ends the list: its end is unknowable
        found = _resync(d, unknown, left, first_id + i + 1, what)
        if found is None:
            return (
                states,
                (
                    f"{what}: could not find the end of unknown serializer snapshot "
                    f"{unknown.error.class_name}; {left} later state(s) unread"
                ),
                False,
            )
        rest, end, end_known = found
        states[-1:] = rest
        d.pos = end
        return states, None, end_known
    return states, None, True


def _resync(
    d: Decoder, u: _Unknown, left: int, next_id: int, what: str
) -> tuple[list[StateInfo], int, bool] | None:
    """Find where parsing can continue after an unknown snapshot; parse the rest from there."""
    partial = u.partial
    tail: list[bool] = []

    def later_states(p: Decoder) -> list[StateInfo]:
        states, error, end_known = _read_states(p, left, next_id, what)
        if error is not None:
            raise p.error(error)
        tail.append(end_known)
        return states

    def rest_from_serializer(p: Decoder) -> list[StateInfo]:
        sers = dict(partial.serializers)
        for _ in range(u.remaining):
            key = p.read_utf()
            sers[key] = read_top_level_snapshot(p)
        first = StateInfo.from_header(
            partial.name,
            partial.backend_type,
            partial.options,
            sers,
            partial.state_id,
            partial.reason,
        )
        return [first, *later_states(p)]

    def rest_from_state(p: Decoder) -> list[StateInfo]:
        return [partial, *later_states(p)]

    for pos, kind in _candidates(d.buf, u.resume, d.end):
        tail.clear()
        if kind == "ser" and u.remaining > 0:
            got = _try(rest_from_serializer, d, pos)
        elif kind == "state" and u.remaining == 0 and left > 0:
            got = _try(rest_from_state, d, pos)
        else:
            continue
        if got is not None:
            return got[0], got[1], all(tail)
    return None


# -- keyed proxy -------------------------------------------------------------------------------


def read_keyed_proxy(d: Decoder) -> KeyedBackendProxy:
    """Parse a ``KeyedBackendSerializationProxy`` at the decoder's position."""
    pos = d.pos
    version = d.read_int()
    if version != KEYED_PROXY_VERSION:
        if 0 < version < KEYED_PROXY_VERSION:
            raise UnsupportedFormatError(
                f"{d.source}: keyed state header version {version} (written before Flink 1.8) "
                f"is not supported; statequery reads version {KEYED_PROXY_VERSION}"
            )
        raise d.error(f"not a keyed state header: version {version}", pos)
    compressed = d.read_bool()
    key_error: str | None = None
    try:
        key_spec = read_top_level_snapshot(d)
    except UnknownSerializerError as e:
        key_spec = OpaqueSpec(snapshot_class=e.class_name, family="unknown", reason=str(e))
        key_error = f"key serializer: {e}"
        resumed = _resync_key(d)
        if resumed is None:
            return KeyedBackendProxy(
                version,
                compressed,
                key_spec,
                (),
                None,
                f"{key_error}; the state list after it could not be read",
            )
        states, end = resumed
        d.pos = end
        return KeyedBackendProxy(version, compressed, key_spec, tuple(states), end, key_error)
    npos = d.pos
    n = d.read_short()
    if n < 0:
        raise d.error(f"negative state count {n}", npos)
    states, error, end_known = _read_states(d, n, 0, "keyed state header")
    header_end = d.pos if end_known else None
    return KeyedBackendProxy(version, compressed, key_spec, tuple(states), header_end, error)


def _resync_key(d: Decoder) -> tuple[list[StateInfo], int] | None:
    """After an unknown key serializer: find ``int16 numStates`` + the state list."""

    def states_from(p: Decoder) -> list[StateInfo]:
        n = p.read_short()
        if n <= 0:
            raise p.error("no states")
        out, error, end_known = _read_states(p, n, 0, "keyed state header")
        if error or not end_known:
            raise p.error(error or "end unknown")
        return out

    for pos, kind in _candidates(d.buf, d.pos, d.end):
        if kind != "state" or pos < 2:
            continue
        got = _try(states_from, d, pos - 2)
        if got is not None:
            return got
    return None


# -- operator proxy ----------------------------------------------------------------------------


def read_operator_proxy(d: Decoder) -> OperatorBackendProxy:
    """Parse an ``OperatorBackendSerializationProxy`` at the decoder's position."""
    pos = d.pos
    version = d.read_int()
    if version not in OPERATOR_PROXY_VERSIONS:
        if 0 < version < OPERATOR_PROXY_VERSIONS[0]:
            raise UnsupportedFormatError(
                f"{d.source}: operator state header version {version} is not supported "
                f"(statequery reads versions {OPERATOR_PROXY_VERSIONS})"
            )
        raise d.error(f"not an operator state header: version {version}", pos)
    compressed = d.read_bool() if version >= 6 else False
    npos = d.pos
    n = d.read_short()
    if n < 0:
        raise d.error(f"negative operator state count {n}", npos)
    op_states, error, end_known = _read_states(d, n, 0, "operator state header")
    if error is not None or not end_known:
        error = (
            error
            or "operator state header: the broadcast states after an unknown "
            "serializer snapshot could not be read"
        )
        return OperatorBackendProxy(version, compressed, tuple(op_states), (), None, error)
    npos = d.pos
    nb = d.read_short()
    if nb < 0:
        raise d.error(f"negative broadcast state count {nb}", npos)
    bc_states, error, end_known = _read_states(d, nb, 0, "operator state header (broadcast)")
    end = d.pos if end_known and error is None else None
    return OperatorBackendProxy(version, compressed, tuple(op_states), tuple(bc_states), end, error)


# -- reading a header through the storage seam -------------------------------------------------

HEADER_PREFIX = 16 << 10  # first read; doubled while the header runs past the prefix
MAX_HEADER = 64 << 20

H = TypeVar("H", KeyedBackendProxy, OperatorBackendProxy)


def read_header(
    resolver: HandleResolver,
    handle: StreamHandle,
    parse: Callable[[Decoder], H],
    prefix: int = HEADER_PREFIX,
) -> H:
    """Parse the header at the start of ``handle``'s stream, reading only as much as it needs.

    Starts with ``prefix`` bytes and doubles while parsing runs off the end of the prefix (and
    the stream is longer), so a 100 MB state file costs a few KB.
    """
    return read_header_bytes(resolver, handle, parse, prefix)[0]


def read_header_bytes(
    resolver: HandleResolver,
    handle: StreamHandle,
    parse: Callable[[Decoder], H],
    prefix: int = HEADER_PREFIX,
) -> tuple[H, bytes]:
    """:func:`read_header`, and the stream's first bytes it read (at least the header; as many
    as ``prefix`` when the stream holds them), for a caller that wants bytes right after the
    header without a request of its own."""
    source = resolver.source_name(handle)
    total = resolver.stream_size(handle)
    size = min(prefix, total) if total else prefix
    while True:
        data = resolver.read(handle, 0, size)
        truncated_prefix = len(data) >= size and size < total
        d = Decoder(data, source=source)
        try:
            result = parse(d)
        except CorruptStateError as e:
            if truncated_prefix and size < MAX_HEADER and _ran_off(e, len(data)):
                size = min(size * 4, total, MAX_HEADER)
                continue
            raise
        if truncated_prefix and _incomplete(result):
            # an unknown snapshot's resync may need bytes past the prefix
            size = min(size * 4, total, MAX_HEADER)
            continue
        return result, data


def _ran_off(e: CorruptStateError, n: int) -> bool:
    """Did the parse fail because it needed bytes beyond a (prefix) buffer of ``n`` bytes?"""
    reason = e.reason
    return (
        "left" in reason
        or "past the end" in reason
        or "cannot read the Java" in reason
        or (e.offset is not None and e.offset >= n - 64)
    )


def _incomplete(result: KeyedBackendProxy | OperatorBackendProxy) -> bool:
    return result.error is not None
