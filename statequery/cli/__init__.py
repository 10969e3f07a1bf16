"""The ``statequery`` console script (``statequery --help`` lists its commands).

The package: :mod:`~statequery.cli.app` (the entry point, :func:`main`: one-line errors, exit
statuses), :mod:`~statequery.cli.parser` (the command line), one module per command family
(:mod:`~statequery.cli.metadata`: inspect, snapshot; :mod:`~statequery.cli.read`: read,
lookup; :mod:`~statequery.cli.query`: sql, spark-views; :mod:`~statequery.cli.spark`: attach,
detach, shell, serve, sql --spark; :mod:`~statequery.cli.extra`: diff, stats, splits, export;
:mod:`~statequery.cli.history`: versions, changes, history; :mod:`~statequery.cli.capture`),
and :mod:`~statequery.cli.output` (tables, JSON, files).

Errors print ``statequery: <message>`` on stderr and exit with status 1.
"""

from __future__ import annotations

from statequery.cli.app import main

__all__ = ["main"]
