"""Spark's entry point for statequery, found statically by name.

``spark.read.format("statequery")`` and ``CREATE TABLE ... USING statequery`` make Spark look for
``pyspark_statequery.DefaultSource``; this module only re-exports the real data source, which
lives in :mod:`statequery.spark`.
"""

from __future__ import annotations

from statequery.spark import StatequeryDataSource as DefaultSource

__all__ = ["DefaultSource"]
