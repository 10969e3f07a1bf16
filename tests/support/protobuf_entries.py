"""The oracle's rendering of the Protobuf fixtures' messages (their bytes, ``{"bytes":
{"$bytes": ...}}``, SavepointDump with -Dstatequery.dump.kryoFields) from statequery's decoded
structs: each message re-encoded (deterministically, as the job's messages were written) from
the struct alone, so that a lossless decode gives back Flink's bytes exactly."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_TIMESTAMP = "google.protobuf.Timestamp"


def _nanos(v: Any) -> int:
    return int(v.value) if hasattr(v, "value") else int(v)


def _conv(f: Any, v: Any) -> Any:
    return f.enum_type.values_by_name[v].number if f.enum_type is not None else v


def fill(m: Any, value: dict[str, Any]) -> Any:
    """``m`` with the fields of statequery's struct ``value``."""
    for f in m.DESCRIPTOR.fields:
        v = value[f.name]
        if v is None:
            continue
        target = getattr(m, f.name)
        mt = f.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            for k, x in v:
                if vf.message_type is not None:
                    fill(target[k], x)
                else:
                    target[k] = _conv(vf, x)
        elif f.is_repeated:
            for x in v:
                if mt is not None:
                    fill(target.add(), x)
                else:
                    target.append(_conv(f, x))
        elif mt is not None and mt.full_name == _TIMESTAMP:
            target.seconds, target.nanos = divmod(_nanos(v), 1_000_000_000)
        elif mt is not None:
            target.SetInParent()
            fill(target, v)
        else:
            setattr(m, f.name, _conv(f, v))
    return m


def reencoded(sp: Any, operator: Any, state: str, table: pa.Table) -> tuple[pa.Table, bool]:
    """``table`` with a decoded Protobuf ``value`` column as the messages' bytes; True when
    it was one (its entries' values are then wrapped as the oracle's ``{"bytes": ...}``)."""
    from statequery.arrow.kryo import kryo_codec

    if "value" not in table.column_names:
        return table, False
    field = table.schema.field("value")
    if (field.metadata or {}).get(b"statequery.decoding") != b"protobuf":
        return table, False
    spec = sp.state(operator, state).value
    codec = kryo_codec(spec, sp.context.classpath)
    assert codec is not None
    pb = codec.protobuf_codec(spec.type_class)
    assert pb is not None
    out = [None if v is None else fill(pb.message_class(), v).SerializeToString(deterministic=True)
           for v in table.column("value").to_pylist()]
    i = table.schema.get_field_index("value")
    return table.set_column(i, "value", pa.array(out, pa.binary())), True


def wrap(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oracle's rendering of a Reading: its bytes under ``bytes``."""
    return [dict(e, value={"bytes": e["value"]}) if e.get("value") is not None else e
            for e in entries]
