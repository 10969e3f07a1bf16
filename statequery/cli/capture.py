"""``statequery capture``: the StateMeta snapshot recorded when the savepoint is taken.

    statequery capture --rest URL JOB_ID [--savepoint DIR | --latest-checkpoint] [--out FILE]
                       [--timeout S] [--native]
    statequery capture --rest URL JOB_ID --catalog DIR [--keep K] [--every S [--count N]]

Registered by :mod:`statequery.cli` through :func:`add_parser` and :func:`run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statequery.capture import CaptureResult

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "capture", parents=parents,
        help="take a savepoint of a running job (or its latest checkpoint) and record the job "
             "with it: job name, vertex names, SQL column names",
        description="Ask a running Flink cluster's REST API for a savepoint of JOB_ID (or its "
        "latest completed checkpoint), record the job graph, vertex descriptions, configuration "
        "and time, and write the StateMeta snapshot beside the savepoint. With --catalog, each "
        "capture is one database of that folder, named by job and time; --keep prunes older "
        "ones, --every repeats. On any failure nothing is written.",
    )
    c.add_argument("job_id", help="the job id (32 hex characters)")
    c.add_argument("--rest", required=True, help="the JobManager's REST URL, "
                   "e.g. http://jobmanager:8081")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--savepoint", metavar="DIR",
                       help="savepoint target directory (default: the cluster's "
                            "execution.checkpointing.savepoint-dir)")
    where.add_argument("--latest-checkpoint", action="store_true",
                       help="take the latest completed checkpoint instead of a savepoint")
    where.add_argument("--catalog", metavar="DIR",
                       help="take the savepoint into DIR/<job>_<time>/ (one database each)")
    c.add_argument("--out", metavar="FILE",
                   help="write the StateMeta snapshot here instead of beside the savepoint "
                        "(open it with statequery.open(path, snapshot=FILE))")
    c.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the savepoint (default 600)")
    c.add_argument("--native", action="store_true", help="a NATIVE savepoint (default CANONICAL)")
    c.add_argument("--keep", type=int, default=5,
                   help="with --catalog: keep the newest K captures of this job (default 5)")
    c.add_argument("--every", type=float, metavar="SECONDS",
                   help="with --catalog: capture every N seconds (default: once, for cron)")
    c.add_argument("--count", type=int, help="with --every: stop after N captures")


def _print(result: CaptureResult, removed: list[str]) -> None:
    job = result.job
    named = sum(1 for v in job.vertices if v.description)
    print(f"captured {job.trigger} of job {job.job_name!r} ({job.job_id}) at {job.captured_at}: "
          f"{result.location}")
    print(f"  StateMeta snapshot {result.snapshot} ({len(job.vertices)} vertices, {named} "
          f"described{f', savepoint took {result.seconds:.1f} s' if result.seconds else ''})")
    for name in removed:
        print(f"  removed older capture {name}")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    from statequery.capture import capture, follow
    from statequery.cli.output import _storage_options
    from statequery.exceptions import InvalidOptionError

    options = _storage_options(args)
    if args.catalog is None:
        if args.every is not None or args.count is not None:
            raise InvalidOptionError("--every and --count need --catalog DIR")
        result = capture(args.rest, args.job_id, savepoint=args.savepoint,
                         latest_checkpoint=args.latest_checkpoint, out=args.out,
                         timeout=args.timeout, native=args.native, storage_options=options)
        _print(result, [])
        return 0
    if args.out is not None:
        raise InvalidOptionError("--out and --catalog: the snapshot goes beside each savepoint")
    follow(args.rest, args.job_id, args.catalog, keep=args.keep, every=args.every,
           count=args.count, timeout=args.timeout, native=args.native, storage_options=options,
           on_capture=_print)
    return 0
