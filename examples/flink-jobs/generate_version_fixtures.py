"""Fixtures written by older Flink versions (1.15 to 2.2): see docs/fixtures.md, "Fixtures of other
Flink versions".

    python examples/flink-jobs/generate_version_fixtures.py --version 1.20     # all of 1.20
    python examples/flink-jobs/generate_version_fixtures.py --only v1.20-datastream-hashmap-native

Each version's jars come from the PyPI package ``apache-flink-libraries==X.Y.Z`` (the jars are in
its ``pyflink/lib``), installed into its own venv: ``/work/flinkvers/<X.Y.Z>/venv`` by default,
``--flink-home DIR`` for another root (``DIR/<X.Y.Z>/venv``)::

    python3 -m venv DIR/1.20.5/venv && DIR/1.20.5/venv/bin/pip install --no-deps \\
        apache-flink-libraries==1.20.5

For a version the Java programs are compiled against that version's jars into
``build/<X.Y.Z>/``: Flink 2.x compiles ``src/`` unchanged; Flink 1.x compiles ``src/`` with the
files of ``src-1.x/`` replacing those of the same name (the 1.x APIs: ``Time`` window sizes,
``open(Configuration)``, ``Sink.InitContext``, the 1.x state-backend classes and configuration
keys). The job runs on that version's MiniCluster (Java 17, with the ``--add-opens`` flags of
Flink's ``env.java.opts.all`` default), the snapshot is copied into
``tests/fixtures/v<X.Y>-<name>/``,
the expected file is the same model as for 2.3.0 (generate_fixtures.py) and the oracle dump is made
by ``SavepointDump`` compiled against -- and run with -- that version's jars. The dump is taken from
the snapshot where the job wrote it (absolute handles of incremental checkpoints exist there), then
the fixture is recorded in ``manifest.json`` with its ``flink_version``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import generate_fixtures as gf

HERE = Path(__file__).resolve().parent
FIXTURES = gf.FIXTURES
SCRATCH = Path(os.environ.get("STATEQUERY_VERSIONS_SCRATCH", "/work/scratch/versions"))
FLINK_HOME = Path(os.environ.get("STATEQUERY_FLINK_VERSIONS", "/work/flinkvers"))
MAX_FIXTURE_BYTES = 600 * 1024

# minor version -> the newest patch release on PyPI (apache-flink-libraries)
VERSIONS = {
    "2.2": "2.2.1", "2.1": "2.1.3", "2.0": "2.0.2",
    "1.20": "1.20.5", "1.19": "1.19.3", "1.18": "1.18.1", "1.17": "1.17.2", "1.16": "1.16.3",
    "1.15": "1.15.4",
}

# Java 17 needs these for Flink 1.x (Flink's own env.java.opts.all default for Java 17); harmless
# for 2.x.
JAVA_OPTS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    *(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.lang", "java.net", "java.io", "java.nio", "sun.nio.ch", "java.lang.reflect",
        "java.text", "java.time", "java.util", "java.util.concurrent",
        "java.util.concurrent.atomic", "java.util.concurrent.locks")),
]

# The Java sources a version needs (the other jobs of src/ use APIs newer than some versions).
SOURCES = [
    "Address", "Event", "Tier", "UserProfile", "FixtureEnumStateSerializer", "FixtureEnumerator",
    "FixtureSource", "FixtureSourceReader", "FixtureSplit", "FixtureSplitSerializer",
    "FixtureFunctions", "DataStreamStateJob", "SnapshotInfo", "SavepointDump", "DumpEnvironment",
    "DumpJson", "DumpValues", "DumpCep", "DumpMultiset", "RawKeyedTimers", "SqlVersionJob",
    "SqlCepVersionJob", "TtlKryoJob", "Note",
]
SOURCES_1X = ["BackendCompat"]  # only in src-1.x


def _vfx(minor: str, base: str, job: str, backend: str, snapshot: str, fmt: str,
         incremental: bool = False, max_parallelism: int = 128) -> dict:
    fx = gf._fx(f"v{minor}-{base}", job, backend, snapshot, fmt, incremental=incremental,
                max_parallelism=max_parallelism)
    fx["flink_version"] = VERSIONS[minor]
    return fx


def version_matrix(minor: str) -> list[dict]:
    extra = []
    if minor == "1.15":
        # 1.15 writes RocksDB full checkpoints as key-group handles (type 12, as a heap
        # checkpoint) in the canonical layout; with 20 users over max parallelism 6 every key
        # group holds data, so every offset is set, as in a heap checkpoint
        extra.append(_vfx(minor, "datastream-rocksdb-full-checkpoint-maxpar6", "datastream",
                          "rocksdb", "checkpoint", "native", max_parallelism=6))
    return extra + [
        _vfx(minor, "datastream-hashmap-canonical", "datastream", "hashmap", "savepoint",
             "canonical"),
        _vfx(minor, "datastream-rocksdb-native", "datastream", "rocksdb", "savepoint", "native"),
        _vfx(minor, "datastream-rocksdb-incremental-checkpoint", "datastream", "rocksdb",
             "checkpoint", "native", incremental=True),
        _vfx(minor, "datastream-hashmap-native", "datastream", "hashmap", "savepoint", "native"),
        _vfx(minor, "datastream-rocksdb-canonical", "datastream", "rocksdb", "savepoint",
             "canonical"),
        _vfx(minor, "datastream-hashmap-checkpoint", "datastream", "hashmap", "checkpoint",
             "native"),
        _vfx(minor, "datastream-rocksdb-full-checkpoint", "datastream", "rocksdb", "checkpoint",
             "native"),
        _vfx(minor, "ttl-kryo-hashmap-canonical", "ttl-kryo", "hashmap", "savepoint", "canonical"),
        _vfx(minor, "ttl-kryo-rocksdb-native", "ttl-kryo", "rocksdb", "savepoint", "native"),
        _vfx(minor, "sql-hashmap-canonical", "sql-version", "hashmap", "savepoint", "canonical"),
        _vfx(minor, "sql-hashmap-native", "sql-version", "hashmap", "savepoint", "native"),
        _vfx(minor, "sql-hashmap-checkpoint", "sql-version", "hashmap", "checkpoint", "native"),
        _vfx(minor, "sql-rocksdb-canonical", "sql-version", "rocksdb", "savepoint", "canonical"),
        _vfx(minor, "sql-rocksdb-full-checkpoint", "sql-version", "rocksdb", "checkpoint",
             "native"),
        _vfx(minor, "sql-rocksdb-native", "sql-version", "rocksdb", "savepoint", "native",
             incremental=True),
        _vfx(minor, "sql-rocksdb-incremental-checkpoint", "sql-version", "rocksdb", "checkpoint",
             "native", incremental=True),
    ] + ([
        # MATCH_RECOGNIZE: 1.15's NFA serializer (snapshot outer version 1) writes no previous
        # timestamp per computation state (SqlCepVersionJob)
        _vfx(minor, "sql-cep-hashmap-native", "sql-cep-version", "hashmap", "savepoint", "native"),
    ] if minor == "1.15" else [])


MATRIX = [fx for minor in VERSIONS for fx in version_matrix(minor)]
BY_NAME = {fx["name"]: fx for fx in MATRIX}


def lib_dir(version: str) -> Path:
    found = sorted((FLINK_HOME / version / "venv").glob("lib/python*/site-packages/pyflink/lib"))
    if not found:
        raise SystemExit(f"no jars for Flink {version} under {FLINK_HOME / version}/venv: "
                         f"pip install --no-deps apache-flink-libraries=={version} there")
    return found[0]


def build_dir(version: str) -> Path:
    return HERE / "build" / version


def build(version: str) -> str:
    """Compile the fixture programs against one version's jars; returns the classpath."""
    out = build_dir(version)
    lib = lib_dir(version)
    marker = out / ".built"
    srcs = {p.stem: p for p in (HERE / "src" / "statequery" / "fixtures").glob("*.java")}
    if not version.startswith("2."):
        srcs.update({p.stem: p for p in (HERE / "src-1.x" / "statequery" / "fixtures")
                     .glob("*.java")})
    files = [srcs[n] for n in SOURCES + ([] if version.startswith("2.") else SOURCES_1X)]
    newest = max(p.stat().st_mtime for p in files)
    listing = "".join(f"{p}\n" for p in files)  # the marker names what was compiled
    if (not marker.exists() or marker.stat().st_mtime < newest
            or marker.read_text() != listing):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        subprocess.run(["nice", "-n", "15", "javac", "-nowarn", "-encoding", "UTF-8", "-d",
                        str(out), "-cp", f"{lib}/*", *map(str, files)], check=True)
        marker.write_text(listing)
    return f"{lib}/*:{out}"


def java(version: str, main: str, *args: str) -> list[str]:
    return ["nice", "-n", "15", "java", *JAVA_OPTS, "-cp", build(version),
            f"statequery.fixtures.{main}", *args]


def has_uids(version: str) -> bool:
    """Only a 2.x ``_metadata`` (version 6) records operator uids and names; 1.x ones (3 to 5)
    have the operator ids alone, so statequery and the oracle report uid "" and name ""."""
    return version.startswith("2.")


def expected(version: str, job: str = "datastream") -> list[dict]:
    """The model of the job (generate_fixtures.py); for ttl-kryo without the Kryo states on 1.x
    (Kryo 2 bytes, not modelled: statequery is compared with the dump there)."""
    if job == "ttl-kryo":
        entries = gf.ttl_kryo_expected()
        if not has_uids(version):
            entries = [e for e in entries if not e["state"].startswith("kryo-")]
    else:
        entries = gf.datastream_expected()
    if not has_uids(version):
        for e in entries:
            e["operator_uid"] = ""
    return entries


SQL_EVENTS = 100  # SqlVersionJob.EVENTS


def sql_expected(dump: Path) -> list[dict]:
    """The part of the SQL job's state the input alone fixes: the group aggregation's accumulator
    (COUNT(*), SUM(amount)) and the deduplication's keep-first flag per user; the operators (no
    uids; 1.x snapshots have no names either) are found in the dump by their state names."""
    ops: dict[str, str] = {}
    for line in dump.read_text().splitlines():
        e = json.loads(line)
        if e["state"] in ("accState", "deduplicate-state"):
            ops[e["state"]] = e["operator_id"]
    entries = []
    for u in range(5):
        mine = [i for i in range(SQL_EVENTS) if i % 5 == u]
        base = {"operator_uid": "", "kind": "value", "key": {"f0": f"user-{u}"}, "namespace": None}
        entries.append({**base, "operator_id": ops.get("accState", "?"), "state": "accState",
                        "value": {"f0": len(mine), "f1": sum(i * 37 % 101 for i in mine)}})
        entries.append({**base, "operator_id": ops.get("deduplicate-state", "?"),
                        "state": "deduplicate-state", "value": True})
    return entries


CEP_QUEUED = range(96, 100)  # SqlCepVersionJob: the events after the watermark


def sql_cep_expected(dump: Path) -> list[dict]:
    """SqlCepVersionJob: the events waiting in the pattern operator's queue (event time -> the
    row: id, usr, amount, ts in epoch nanoseconds); the NFA and shared buffer are the oracle's."""
    op = next((json.loads(line)["operator_id"] for line in dump.read_text().splitlines()
               if json.loads(line)["state"] == "eventQueuesStateName"), "?")
    entries = []
    for i in CEP_QUEUED:
        ts = 1_700_000_000_000 + i * 60_000
        entries.append({"operator_uid": "", "operator_id": op, "state": "eventQueuesStateName",
                        "kind": "map", "key": {"f0": f"user-{i % 5}"}, "namespace": None,
                        "user_key": ts, "value": [{"f0": i, "f1": f"user-{i % 5}",
                                                   "f2": i * 37 % 101, "f3": ts * 1_000_000}]})
    return entries


def subset(fx: dict) -> bool:
    """The expected file holds only part of the entries (the dump is compared with them and
    statequery with the whole dump)."""
    return fx["job"] in ("sql-version", "sql-cep-version") or (
        fx["job"] == "ttl-kryo" and not has_uids(fx["flink_version"]))


def _kind(fx: dict) -> str:
    return "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"


def runs(selected: list[dict]) -> list[list[dict]]:
    """The selected fixtures grouped into job runs: one run per (version, backend, incremental)
    takes its savepoints (canonical, native) and then its checkpoint, one after the other (the
    job's state no longer changes once its 200 events are in)."""
    groups: dict[tuple, list[dict]] = {}
    for fx in selected:
        key = (fx["flink_version"], fx["job"], fx["backend"], fx["incremental"],
               fx["max_parallelism"])
        groups.setdefault(key, []).append(fx)
    order = ["savepoint-canonical", "savepoint-native", "checkpoint"]
    return [sorted(g, key=lambda fx: order.index(_kind(fx))) for g in groups.values()]


def generate_run(fxs: list[dict], attempts: int = 2) -> list[dict]:
    """One job run and its snapshots; each becomes its own fixture, checked against the oracle."""
    version = fxs[0]["flink_version"]
    sql = fxs[0]["job"] in ("sql-version", "sql-cep-version")
    cep = fxs[0]["job"] == "sql-cep-version"
    label = (f"v{version}-{'sql-cep-' if cep else 'sql-' if sql else ''}{fxs[0]['backend']}"
             + ("-incremental" if fxs[0]["incremental"] else "")
             + (f"-maxpar{fxs[0]['max_parallelism']}" if fxs[0]["max_parallelism"] != 128 else ""))
    exp = {fx["name"]: FIXTURES / "expected" / f"{fx['name']}.jsonl" for fx in fxs}
    dumps = {fx["name"]: FIXTURES / "dump" / f"{fx['name']}.jsonl" for fx in fxs}
    for fx in fxs:
        exp[fx["name"]].unlink(missing_ok=True)
        dumps[fx["name"]].unlink(missing_ok=True)
        shutil.rmtree(FIXTURES / fx["name"], ignore_errors=True)
    problems: list[str] = []
    for attempt in range(1, attempts + 1):
        scratch = SCRATCH / f"{label}-{attempt}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        fx0 = fxs[0]
        kinds = ",".join(_kind(fx) for fx in fxs)
        if fx0["job"] == "ttl-kryo":
            cmd = java(version, "TtlKryoJob", fx0["backend"], kinds, str(scratch / "out"))
        elif sql:
            cmd = java(version, "SqlCepVersionJob" if cep else "SqlVersionJob", fx0["backend"],
                       str(fx0["incremental"]).lower(), kinds, str(scratch / "out"))
        else:
            cmd = java(version, "DataStreamStateJob", fx0["backend"],
                       str(fx0["incremental"]).lower(), str(fx0["max_parallelism"]), "false",
                       "false", kinds, str(scratch / "out"))
        t0 = time.time()
        with open(scratch / "job.log", "w") as log:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=900)
        snaps = [Path(line.split("=", 1)[1]) for line in proc.stdout.splitlines()
                 if line.startswith("SNAPSHOT_PATH=")]
        if proc.returncode != 0 or len(snaps) != len(fxs):
            raise RuntimeError(f"{label}: job failed ({proc.returncode}), see {scratch}/job.log")
        print(f"  {label}: job took {time.time() - t0:.1f}s -> {[s.name for s in snaps]}")

        pairs: list[str] = []
        for fx, snap in zip(fxs, snaps, strict=True):
            if not sql:
                gf.write_jsonl(exp[fx["name"]], expected(version, fx["job"]))
            pairs += [str(snap), str(dumps[fx["name"]])]
        t0 = time.time()
        with open(scratch / "dump.log", "w") as err:
            # 1.x: what RocksDB wrote is restored by RocksDB (1.15's full checkpoints are key-group
            # handles in the full-snapshot format, which the heap backend cannot restore)
            rocks = fx0["backend"] == "rocksdb" and not has_uids(version)
            opts = ["--backend=rocksdb"] if rocks else []
            ok = subprocess.run(java(version, "SavepointDump", *opts, *pairs), stdout=err,
                                stderr=err, timeout=900).returncode == 0
        print(f"  {label}: dumps took {time.time() - t0:.1f}s")
        problems = [] if ok else [f"SavepointDump failed, see {scratch / 'dump.log'}"]
        for fx in fxs:
            if dumps[fx["name"]].exists():
                if sql:
                    model = sql_cep_expected if cep else sql_expected
                    gf.write_jsonl(exp[fx["name"]], model(dumps[fx["name"]]))
                problems += [f"{fx['name']}: {p}" for p in
                             gf.compare(exp[fx["name"]], dumps[fx["name"]], subset=subset(fx))]
        if problems and attempt < attempts:
            print(f"  {label}: dump differs from expected ({len(problems)} lines), retrying:\n    "
                  + "\n    ".join(problems[:10]), file=sys.stderr)
            continue
        break
    if problems:
        raise RuntimeError(f"{label}: dump differs from expected ({len(problems)} lines):\n    "
                           + "\n    ".join(problems[:20]))

    records = []
    for fx, snap in zip(fxs, snaps, strict=True):
        name = fx["name"]
        dest = FIXTURES / name
        if fx["snapshot"] == "savepoint":
            shutil.copytree(snap, dest / snap.name)
            rel = f"{name}/{snap.name}"
        else:
            shutil.copytree(snap.parent, dest / snap.parent.name)
            rel = f"{name}/{snap.parent.name}/{snap.name}"
        proc = subprocess.run(java(version, "SnapshotInfo", str(FIXTURES / rel)),
                              capture_output=True, text=True, check=True)
        infos = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for info in infos:
            if info["uid"] and info["operator_id"] != gf.operator_id_for_uid(info["uid"]):
                raise RuntimeError(f"operator id mismatch for uid {info['uid']}: {info}")
        by_id = {gf.operator_id_for_uid(u): u for u in [*gf.DS_UIDS, *gf.TK_UIDS]}
        if not has_uids(version) and not sql:  # the job's uids (from the ids): the state lists
            for info in infos:
                info["uid"] = by_id[info["operator_id"]]
        size = gf.du(dest)
        if size > MAX_FIXTURE_BYTES:
            raise RuntimeError(f"{name} is {size} bytes, over the {MAX_FIXTURE_BYTES} byte budget")
        print(f"  {name}: {size} bytes, dump matches the model")
        rec = gf.manifest_record(fx, rel, infos)
        rec["flink_version"] = version
        if sql:  # the states Flink's restore has entries for (as for the SQL operator fixtures)
            states = gf._states_in_dump(name)
            for op in rec["operators"]:
                op["states"] = states.get(op["operator_id"], [])
        if subset(fx):
            rec["expected"] = "subset"
        if not has_uids(version):
            for op in rec["operators"]:
                op["uid"] = op["name"] = ""
        records.append(rec)
    return records


def kryo_types_run(version: str, backend: str = "hashmap", fmt: str = "canonical") -> dict:
    """``v{minor}-types-kryo-{backend}-{fmt}``: ``types_run`` of the ``kryo-types`` job."""
    return types_run(version, "kryo-types", backend, fmt)


def types_run(version: str, job: str, backend: str = "hashmap", fmt: str = "canonical") -> dict:
    """``v{minor}-types-kryo-{backend}-{fmt}`` (``job`` kryo-types) or
    ``v{minor}-types-protobuf-{backend}-{fmt}`` (proto-types), 1.19 and later (the jobs use
    ``OpenContext``): ``src/statequery/kryotypes`` (``prototypes``; on 1.x with the files of
    ``src-1.x/statequery/prototypes`` replacing those of the same name: Kryo 2.24's
    ``Serializer.read``) compiled against the release's jars and run on them, its classes and
    sources as ``job.jar`` beside the savepoint (proto-types: and ``descriptors.pb``), the
    release's ``SavepointDump`` with those classes and ``-Dstatequery.dump.kryoFields=true``
    checked against the model (``kryo_types_expected``/``proto_types_expected``, uids "" on 1.x);
    returns the manifest record."""
    minor = version.rsplit(".", 1)[0]
    proto = job == "proto-types"
    if job == "types-avro":
        return avro_run(version, backend, fmt)
    family, pkg = ("protobuf", "prototypes") if proto else ("kryo", "kryotypes")
    fx = _vfx(minor, f"types-{family}-{backend}-{fmt}", job, backend, "savepoint", fmt)
    name = fx["name"]
    cp = build(version)
    scratch = SCRATCH / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    srcs = {p.name: p for p in (HERE / "src" / "statequery" / pkg).iterdir() if p.is_file()}
    if not has_uids(version) and (HERE / "src-1.x" / "statequery" / pkg).is_dir():
        srcs.update({p.name: p for p in (HERE / "src-1.x" / "statequery" / pkg).iterdir()})
    sources = scratch / "src"  # the sources compiled, as the jar holds them
    (sources / "statequery" / pkg).mkdir(parents=True)
    for n, p in srcs.items():
        shutil.copyfile(p, sources / "statequery" / pkg / n)
    classes = build_dir(version) / pkg
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    subprocess.run(["nice", "-n", "15", "javac", "-nowarn", "-encoding", "UTF-8", "-d",
                    str(classes), "-cp", cp,
                    *map(str, sorted((sources / "statequery" / pkg).glob("*.java")))],
                   check=True)
    cp = f"{cp}:{classes}"
    args: list[str] = []
    if proto:
        gf._PT_DESCRIPTORS[:] = [gf.pt_descriptors(scratch)]
        messages = scratch / "messages.txt"
        messages.write_text("".join(base64.b64encode(m).decode("ascii") + "\n"
                                    for m in gf.pt_messages(gf._PT_DESCRIPTORS[0])))
        args = [str(messages)]
    main = "statequery.prototypes.ProtoTypesJob" if proto else "statequery.kryotypes.KryoTypesJob"
    with open(scratch / "job.log", "w") as log:
        proc = subprocess.run(["nice", "-n", "15", "java", *JAVA_OPTS, "-cp", cp, main, backend,
                               f"savepoint-{fmt}", str(scratch / "out"), *args],
                              stdout=subprocess.PIPE, stderr=log, text=True, timeout=900)
    snaps = [Path(line.split("=", 1)[1]) for line in proc.stdout.splitlines()
             if line.startswith("SNAPSHOT_PATH=")]
    if proc.returncode != 0 or len(snaps) != 1:
        raise RuntimeError(f"{name}: job failed ({proc.returncode}), see {scratch}/job.log")
    dest = FIXTURES / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(snaps[0], dest / snaps[0].name)
    jar_dir = gf.PT_JAR_CLASSES if proto else gf.KT_JAR_CLASSES
    subprocess.run(["jar", "--create", "--file", str(dest / "job.jar"),
                    "--date=2026-01-01T00:00:00Z", "-C", str(classes), jar_dir,
                    "-C", str(sources), jar_dir], check=True)
    if proto:
        shutil.copyfile(gf._PT_DESCRIPTORS[0], dest / "descriptors.pb")
    entries = gf.proto_types_expected() if proto else gf.kryo_types_expected()
    return _check_and_record(version, fx, dest, snaps[0], cp, entries, job, kryo_fields=True,
                             scratch=scratch)


def avro_run(version: str, backend: str = "hashmap", fmt: str = "canonical") -> dict:
    """``v{minor}-types-avro-{backend}-{fmt}``: ``src-avro/`` (AvroStateJob, the oracle's
    DumpAvro) compiled against the release's jars and ``FLINK_AVRO_CLASSPATH`` (flink-avro's
    ``AvroSerializer`` for that release, Avro's and Jackson's jars: docs/fixtures.md, "The Avro
    job") and run on them; the release's ``SavepointDump`` with those classes checked against the
    model (``avro_expected``, uids "" on 1.x); returns the manifest record."""
    avro_cp = os.environ.get("FLINK_AVRO_CLASSPATH")
    if not avro_cp:
        raise SystemExit("--job types-avro needs FLINK_AVRO_CLASSPATH (docs/fixtures.md)")
    minor = version.rsplit(".", 1)[0]
    fx = _vfx(minor, f"types-avro-{backend}-{fmt}", "types-avro", backend, "savepoint", fmt)
    name = fx["name"]
    cp = build(version)
    scratch = SCRATCH / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    classes = build_dir(version) / "avro"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    subprocess.run(["nice", "-n", "15", "javac", "-nowarn", "-encoding", "UTF-8", "-d",
                    str(classes), "-cp", f"{cp}:{avro_cp}",
                    *map(str, sorted((HERE / "src-avro").rglob("*.java")))], check=True)
    cp = f"{cp}:{classes}:{avro_cp}"
    with open(scratch / "job.log", "w") as log:
        proc = subprocess.run(["nice", "-n", "15", "java", *JAVA_OPTS, "-cp", cp,
                               "statequery.fixtures.AvroStateJob", backend, f"savepoint-{fmt}",
                               str(scratch / "out")],
                              stdout=subprocess.PIPE, stderr=log, text=True, timeout=900)
    snaps = [Path(line.split("=", 1)[1]) for line in proc.stdout.splitlines()
             if line.startswith("SNAPSHOT_PATH=")]
    if proc.returncode != 0 or len(snaps) != 1:
        raise RuntimeError(f"{name}: job failed ({proc.returncode}), see {scratch}/job.log")
    dest = FIXTURES / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(snaps[0], dest / snaps[0].name)
    return _check_and_record(version, fx, dest, snaps[0], cp, gf.avro_expected(), "avro-state",
                             kryo_fields=False, scratch=scratch)


def _check_and_record(version: str, fx: dict, dest: Path, snap: Path, cp: str,
                      entries: list[dict], uid: str, kryo_fields: bool, scratch: Path) -> dict:
    """The model as the expected file, the release's dump (``cp``: with the job's classes)
    compared with it, the manifest record of ``dest/snap.name``."""
    name = fx["name"]
    exp = FIXTURES / "expected" / f"{name}.jsonl"
    dump = FIXTURES / "dump" / f"{name}.jsonl"
    if not has_uids(version):
        for e in entries:
            e["operator_uid"] = ""
    gf.write_jsonl(exp, entries)
    # 1.x: what RocksDB wrote is restored by RocksDB (as in generate_run)
    opts = (["--backend=rocksdb"] if fx["backend"] == "rocksdb" and not has_uids(version)
            else [])
    props = ["-Dstatequery.dump.kryoFields=true"] if kryo_fields else []
    with open(scratch / "dump.log", "w") as err:
        ok = subprocess.run(["nice", "-n", "15", "java", *JAVA_OPTS, *props, "-cp", cp,
                             "statequery.fixtures.SavepointDump", *opts, str(dest / snap.name),
                             str(dump)], stdout=err, stderr=err, timeout=900).returncode == 0
    problems = gf.compare(exp, dump) if ok else [f"SavepointDump failed, see {scratch}/dump.log"]
    if problems:
        raise RuntimeError(f"{name}: dump differs from expected ({len(problems)} lines):\n    "
                           + "\n    ".join(problems[:20]))
    rel = f"{name}/{snap.name}"
    proc = subprocess.run(java(version, "SnapshotInfo", str(FIXTURES / rel)),
                          capture_output=True, text=True, check=True)
    infos = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not has_uids(version):
        by_id = {gf.operator_id_for_uid(u): u for u in ("fixture-source", "fixture-sink", uid)}
        for info in infos:
            info["uid"] = by_id.get(info["operator_id"], "")
    rec = gf.manifest_record(fx, rel, infos)
    rec["flink_version"] = version
    if not has_uids(version):
        for op in rec["operators"]:
            op["uid"] = op["name"] = ""
    print(f"  {name}: {gf.du(dest)} bytes, dump matches the model")
    return rec


def write_manifest(records: dict[str, dict]) -> None:
    """Replace or append the given records in the manifest's ``fixtures`` (others untouched);
    the version fixtures are kept in MATRIX order after the 2.3.0 ones."""
    path = FIXTURES / "manifest.json"
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with open(SCRATCH / "manifest.lock", "w") as lock:  # several versions may run at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text())
        old = [r for r in data["fixtures"] if r["name"] not in BY_NAME]
        mine = {r["name"]: r for r in data["fixtures"] if r["name"] in BY_NAME}
        mine.update(records)
        data["fixtures"] = old + [mine[f["name"]] for f in MATRIX if f["name"] in mine]
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)


def insert_record(rec: dict) -> None:
    """A fixture record outside the matrix (``kryo_types_run``) into the manifest: in place of
    the record of that name, else after the last record of its minor version (others
    untouched, in their order)."""
    path = FIXTURES / "manifest.json"
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with open(SCRATCH / "manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text())
        names = [r["name"] for r in data["fixtures"]]
        if rec["name"] in names:
            data["fixtures"][names.index(rec["name"])] = rec
        else:
            prefix = rec["name"].split("-", 1)[0] + "-"
            at = max((i for i, n in enumerate(names) if n.startswith(prefix)),
                     default=len(names) - 1)
            data["fixtures"].insert(at + 1, rec)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--version", action="append", choices=list(VERSIONS),
                    help="every fixture of this minor version (repeatable)")
    ap.add_argument("--only", action="append", choices=sorted(BY_NAME), metavar="NAME",
                    help="one fixture (repeatable)")
    ap.add_argument("--job", choices=["datastream", "ttl-kryo", "sql-version", "sql-cep-version",
                                      "kryo-types", "proto-types", "types-avro"],
                    help="with --version: only this job's fixtures (kryo-types, proto-types, "
                         "types-avro: only so)")
    ap.add_argument("--build-only", action="store_true", help="only compile for the versions")
    args = ap.parse_args()
    if args.job == "kryo-types":  # v{minor}-types-kryo-hashmap-canonical, its own run
        for v in args.version or []:
            insert_record(kryo_types_run(VERSIONS[v]))
            insert_record(kryo_types_run(VERSIONS[v], "rocksdb", "native"))
        return
    if args.job == "proto-types":  # v{minor}-types-protobuf-*, its own run
        for v in args.version or []:
            insert_record(types_run(VERSIONS[v], "proto-types"))
            insert_record(types_run(VERSIONS[v], "proto-types", "rocksdb", "native"))
        return
    if args.job == "types-avro":  # v{minor}-types-avro-* (FLINK_AVRO_CLASSPATH)
        for v in args.version or []:
            insert_record(avro_run(VERSIONS[v]))
            insert_record(avro_run(VERSIONS[v], "rocksdb", "native"))
        return
    selected = [BY_NAME[n] for n in args.only or []]
    selected += [fx for v in args.version or [] for fx in version_matrix(v)
                 if args.job in (None, fx["job"])]
    if not selected:
        ap.error("give --version or --only")
    for v in sorted({fx["flink_version"] for fx in selected}):
        build(v)
    if args.build_only:
        return
    t0 = time.time()
    for group in runs(selected):
        write_manifest({rec["name"]: rec for rec in generate_run(group)})
    print(f"done: {len(selected)} fixture(s) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
