"""How a state's values are decoded: the ``value_decoding`` and ``value_decoding_hint`` columns of
``state_meta`` (docs/avro.md).

``value_decoding`` is one of

* ``native``: every serializer is one statequery decodes from the snapshot alone (Flink's built-in
  types, POJOs, SQL rows...);
* ``avro-schema``: Avro values, decoded from the writer schema the ``AvroSerializerSnapshot``
  keeps (nothing to supply);
* ``kryo-classpath``: Kryo values, decoded with the job's classes (``classpath=``);
* ``protobuf``: Protobuf messages, decoded with a descriptor set (``protobuf_descriptors=``);
* ``raw``: some part stays raw bytes; ``value_decoding_hint`` says what the user can supply to
  decode it, or that nothing can.
"""

from __future__ import annotations

from statequery.metadata.statemeta import StateInfo
from statequery.serializers.spec import CLASSPATH_HINT, AvroSpec, OpaqueSpec, SerializerSpec

__all__ = ["DECODINGS", "value_decoding"]

DECODINGS = ("native", "avro-schema", "kryo-classpath", "protobuf", "raw")

_HINTS = {
    "kryo": CLASSPATH_HINT,
    "java": "nothing: Java-serialized values are not decoded",
}


def _walk(specs: list[SerializerSpec]) -> list[SerializerSpec]:
    out: list[SerializerSpec] = []
    stack = list(specs)
    while stack:
        s = stack.pop()
        out.append(s)
        stack.extend(s.children())
    return out


def value_decoding(s: StateInfo) -> tuple[str, str | None]:
    """``(value_decoding, value_decoding_hint)`` of a state: the hint is set when raw."""
    roots = [x for x in (s.key_spec, s.namespace_spec, s.user_key_spec, s.value_spec) if x]
    nodes = _walk(roots)
    opaque = [n for n in nodes if isinstance(n, OpaqueSpec)]
    if opaque:
        o = opaque[0]
        what = o.type_class or o.snapshot_class or "an unknown class"
        hint = _HINTS.get(o.family)
        if hint is None:
            hint = f"nothing statequery can use ({o.reason or o.family + ' serializer'})"
        return "raw", f"{what}: {hint}"
    if not s.decodable:
        return "raw", f"nothing statequery can use ({s.reason or 'not decodable'})"
    if any(isinstance(n, AvroSpec) for n in nodes):
        return "avro-schema", None
    return "native", None
