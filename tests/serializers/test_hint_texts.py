"""A Kryo value's row reason words its advice as ``state_meta``'s hint does: one text each for
the job's jar (``CLASSPATH_HINT``) and a Protobuf descriptor set (``PROTOBUF_HINT``)."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, fixture_dir

import statequery
from statequery.arrow.kryo import UserTypes, kryo_codec
from statequery.serializers.kryo import KryoUndecodable
from statequery.serializers.spec import CLASSPATH_HINT, PROTOBUF_HINT


def test_a_kryo_row_reason_names_the_classpath_hint() -> None:
    with statequery.open(str(fixture_dir("types-kryo-hashmap-canonical")),
                         use_snapshot=False) as sp:
        reasons = set(sp.read("kryo-types", "order").column("value_reason").to_pylist())
    assert reasons == {"kryo serializer (statequery.kryotypes.Order): Kryo-serialized "
                       f"statequery.kryotypes.Order: pass {CLASSPATH_HINT}"}


def test_a_protobuf_row_reason_names_the_protobuf_hint() -> None:
    name = "types-protobuf-hashmap-canonical"
    with statequery.open(str(fixture_dir(name)), use_snapshot=False) as sp:
        [reason] = set(sp.read("proto-types", "reading").column("value_reason").to_pylist())
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        spec = sp.state("proto-types", "reading").value
    assert reason.endswith(f"own Kryo serializer: if a Protobuf message (chill-protobuf), pass "
                           f"{PROTOBUF_HINT}")
    assert meta["reading"]["value_decoding_hint"].endswith(
        f"if a Protobuf message (chill-protobuf), pass {PROTOBUF_HINT}")
    # with the jar but no descriptor set, the class's own serializer says the same
    codec = kryo_codec(spec, UserTypes((str(FIXTURES / name / "job.jar"),)))
    assert codec is not None
    with pytest.raises(KryoUndecodable) as e:
        codec.arrow_type()
    assert str(e.value).endswith(f"(if a Protobuf message (chill-protobuf), pass {PROTOBUF_HINT})")
