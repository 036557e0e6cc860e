#!/usr/bin/env bash
# Make sure the Spark Connect server that tests/sparkserver.py starts can run: Java 17+ and the
# pyspark wheel (a full Spark distribution, server included) with its Connect client.
# The tests start (and stop) their own server; this script starts nothing.
# Idempotent: installs only what is missing. pip builds the pyspark sdist into a ~450 MB wheel
# once (~100 s) and reuses it from its cache afterwards.
set -euo pipefail
source "$(dirname "$0")/apt.sh"

PYSPARK_VERSION=4.3.0

java_ok() {
    command -v java >/dev/null && java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'
}

if ! java_ok; then
    apt_install "Java 17+" openjdk-17-jre-headless
    java_ok
fi

if python3 -c "import pyspark, sys; sys.exit(pyspark.__version__ != '$PYSPARK_VERSION')" 2>/dev/null \
    && python3 -c "import grpc, grpc_status, google.rpc, pandas, zstandard" 2>/dev/null; then
    echo "prepare-spark.sh: pyspark $PYSPARK_VERSION with its Connect client is installed"
    exit 0
fi
python3 -m pip install -q "pyspark[connect]==$PYSPARK_VERSION"
