#!/usr/bin/env bash
# Compile every Java program under examples/flink-jobs/src against the jars of the
# apache-flink==2.3.0 wheel (no Maven). Output: examples/flink-jobs/build/ (git-ignored).
# Prints the classpath to use with `java -cp`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
flink_lib="$("$python" -c 'import os, pyflink; print(os.path.join(os.path.dirname(pyflink.__file__), "lib"))')"
# opt/flink-python: PyFlink's serializers (ByteArrayWrapperSerializer) for the oracle dump of the
# PyFlink fixtures' process-mode snapshots
cp="$flink_lib/*:$flink_lib/../opt/flink-python-2.3.0.jar:$here/build"
mkdir -p "$here/build"
mapfile -t sources < <(find "$here/src" -name '*.java' | sort)
javac -nowarn -encoding UTF-8 -d "$here/build" -cp "$flink_lib/*" "${sources[@]}" >&2
# service registrations (the s3:// file system of the S3 test server)
cp -r "$here/src/META-INF" "$here/build/"
# The Avro fixture job and the oracle's Avro rendering (src-avro/) need flink-avro's classes and
# Avro's jar (with the Jackson jars Avro uses), which the wheel does not ship: set
# FLINK_AVRO_CLASSPATH to them (docs/fixtures.md, "The Avro fixtures"); without it they are not
# built and the dump shows Avro values as raw bytes.
if [[ -n "${FLINK_AVRO_CLASSPATH:-}" ]]; then
    mapfile -t avro_sources < <(find "$here/src-avro" -name '*.java' | sort)
    javac -nowarn -encoding UTF-8 -d "$here/build" -cp "$flink_lib/*:$FLINK_AVRO_CLASSPATH:$here/build" \
        "${avro_sources[@]}" >&2
    cp="$cp:$FLINK_AVRO_CLASSPATH"
fi
echo "$cp"
