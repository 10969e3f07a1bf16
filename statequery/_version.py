"""The version of statequery (one place: the package and the StateMeta snapshot read it)."""

__version__ = "0.1.0"
