"""One class describes a state: the header's, the model's and the decoders' state are one
:class:`~statequery.metadata.state.StateInfo` (real fixtures, no mocks)."""

from __future__ import annotations

import dataclasses
import pickle

import statequery
import statequery.arrow
import statequery.metadata.kinds
import statequery.metadata.proxy
import statequery.metadata.statemeta
from statequery.decoder import Decoder
from statequery.io import FileIO
from statequery.metadata.checkpoint import load_metadata
from statequery.metadata.handles import HandleResolver
from statequery.metadata.proxy import read_keyed_proxy
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import NamespaceSpec, PrimitiveSpec, TtlSpec
from tests.conftest import fixture_dir

FIXTURE = "datastream-hashmap-canonical"


def _header_states() -> tuple[StateInfo, ...]:
    io = FileIO()
    md = load_metadata(io, str(fixture_dir(FIXTURE) / "_metadata"))
    op = [o for o in md.operators if o.uid == "user-state"][0]
    resolver = HandleResolver(io, md.directory)
    return read_keyed_proxy(Decoder(resolver.read(op.subtasks[0].managed_keyed))).states


def test_the_old_state_classes_are_gone() -> None:
    assert not hasattr(statequery.metadata.proxy, "StateMetaInfo")
    assert not hasattr(statequery.metadata.kinds, "StateLayout")
    assert not hasattr(statequery.arrow, "StateLayout")
    assert statequery.metadata.statemeta.StateInfo is StateInfo
    assert statequery.arrow.StateInfo is StateInfo


def test_the_header_state_is_the_model_state_with_the_operator_filled_in() -> None:
    parsed = _header_states()
    assert [s.state_id for s in parsed] == list(range(len(parsed)))  # ids in header order
    headers = {s.name: s for s in parsed}
    assert all(type(s) is StateInfo for s in headers.values())
    # before the operator is known: kind from the kind table, operator fields empty
    count = headers["count"]
    assert (count.kind, count.operator_id, count.parallelism, count.key_spec) == ("value", "", 0,
                                                                                  None)
    sp = statequery.open(str(fixture_dir(FIXTURE)), use_snapshot=False)
    op = sp.operator("user-state")
    for s in op.states:
        assert type(s) is StateInfo
        h = headers[s.name]
        assert (s.kind, s.serializers, s.backend_type) == (h.kind, h.serializers, h.backend_type)
        assert s.operator_id == op.operator_id and s.parallelism == op.parallelism
        assert s.state_id == 0  # ids are per subtask header (HeaderInfo.state_ids)
    # the decoders' per-row specs are the state's own (TTL unwrapped, list element, map value)
    lst = op.state("recent-categories")
    assert lst is not None and lst.kind == "list"
    assert lst.key is op.key_spec and isinstance(lst.value, PrimitiveSpec)
    assert lst.value.name == "string" and lst.state_value == lst.serializers["VALUE_SERIALIZER"]
    assert isinstance(lst.namespace, NamespaceSpec) and lst.namespace.name == "void"
    assert lst.keyed_rows and not lst.is_timer
    timer = op.state("_timer_state/event_user-timers")
    assert timer is not None and timer.is_timer and timer.state_value is timer.value


def test_replace_derives_the_row_specs_again() -> None:
    long_ = PrimitiveSpec(name="long")
    s = StateInfo("v", "value", serializers={"VALUE_SERIALIZER": TtlSpec(inner=long_)})
    assert (s.key, s.value, s.ttl) == (None, long_, True)  # computed, then cached
    keyed = dataclasses.replace(s, key_spec=PrimitiveSpec(name="string"))
    assert keyed.key == PrimitiveSpec(name="string") and keyed.value == long_
    plain = dataclasses.replace(s, serializers={"VALUE_SERIALIZER": long_})
    assert (plain.value, plain.ttl, plain.state_value) == (long_, False, long_)


def test_equality_ignores_the_cached_specs_and_pickling_keeps_them() -> None:
    sp = statequery.open(str(fixture_dir(FIXTURE)), use_snapshot=False)
    for s in sp.states:
        fresh = dataclasses.replace(s)
        _ = s.value, s.key  # fill the cache of one side only
        assert s == fresh
        back = pickle.loads(pickle.dumps(s))
        assert back == s and type(back) is StateInfo
        assert (back.key, back.namespace, back.user_key, back.value, back.ttl,
                back.state_value) == (s.key, s.namespace, s.user_key, s.value, s.ttl,
                                      s.state_value)
