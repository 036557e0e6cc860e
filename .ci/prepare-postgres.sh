#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries that tests/pgserver.py needs are installed.
# The tests start (and stop) their own throwaway cluster; this script starts nothing.
# Idempotent: does nothing when initdb, pg_ctl and postgres are already present.
set -euo pipefail

have_server() {
    local bindir
    for bindir in "${DDBLOADER_PG_BINDIR:-}" $(pg_config --bindir 2>/dev/null || true) /usr/lib/postgresql/*/bin; do
        if [[ -n "$bindir" && -x "$bindir/initdb" && -x "$bindir/pg_ctl" && -x "$bindir/postgres" ]]; then
            echo "postgres.sh: PostgreSQL server binaries found in $bindir"
            return 0
        fi
    done
    return 1
}

if have_server; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "postgres.sh: no PostgreSQL server and no apt-get to install one" >&2
    exit 1
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO="sudo"
fi

# The tests make their own cluster: stop the package from creating and starting a default one.
$SUDO mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.d/ddbloader.conf >/dev/null

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null

have_server
