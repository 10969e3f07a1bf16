from collections.abc import Sequence

class KeyIndex:
    entries: int
    key_len: int
    nbytes: int
    def find(self, key: bytes) -> list[tuple[int, int, int]]: ...

def build(buf: bytes, prefix_len: int, skips: Sequence[int], key_len: int) -> KeyIndex: ...
