"""The values a user gives to decode their job's own types (:class:`UserTypes`): the one typed
value the read options and every task carry (:mod:`statequery.arrow.kryo` uses it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UserTypes"]


@dataclass(frozen=True)
class UserTypes:
    """What decodes values of the job's own types, carried by a savepoint's read context and
    every task (hashable: codecs are cached by it; picklable: tasks cross processes).

    * ``jars``: the job's jars or class directories (absolute paths), for its Kryo classes;
    * ``kryo_2_24``: Flink 1.x wrote the savepoint, so its Kryo values are Kryo 2.24's;
    * ``protobuf_descriptors``: a ``FileDescriptorSet`` (absolute path): Protobuf messages kept
      through Kryo (chill-protobuf) are decoded with it;
    * ``protobuf_messages``: ``(CLASS, proto.full.Name)`` pairs where protoc's naming does not
      find a class's message.

    False when there is nothing to decode with (no jar, no descriptor set)."""

    jars: tuple[str, ...] = ()
    kryo_2_24: bool = False
    protobuf_descriptors: str | None = None
    protobuf_messages: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.jars or self.protobuf_descriptors)
