#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries that tests/pgserver.py needs are installed.
# The tests start (and stop) their own throwaway cluster; this script starts nothing.
# Idempotent: does nothing when initdb, pg_ctl and postgres are already present.
set -euo pipefail
source "$(dirname "$0")/apt.sh"

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

# The tests make their own cluster: stop the package from creating and starting a default one.
as_root mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.d/ddbloader.conf >/dev/null
apt_install "PostgreSQL server" postgresql

have_server
