#!/usr/bin/env bash
# Start a local PostgreSQL (Debian's postgresql package, no systemd needed) with a database for the orch store,
# and print its URL on stdout:
#
#   export ORCH_TEST_POSTGRES_URL="$(bash scripts/setup_postgres.sh)"    # the store tests also run on it
#   export ORCH_STORE="$ORCH_TEST_POSTGRES_URL"                           # or make it the store of every command
#
# Idempotent. Must run as root. The Python driver is psycopg 3 (`pip install "psycopg[binary]"`).
# Environment knobs: ORCH_PG_DB / ORCH_PG_USER / ORCH_PG_PASSWORD (default orch/orch/orch), ORCH_PG_PORT (5432).
set -euo pipefail

DB="${ORCH_PG_DB:-orch}"
DB_USER="${ORCH_PG_USER:-orch}"
PASSWORD="${ORCH_PG_PASSWORD:-orch}"
PORT="${ORCH_PG_PORT:-5432}"

log() { echo "setup_postgres: $*" >&2; }

if [[ "$(id -u)" != "0" ]]; then
    log "must run as root"; exit 1
fi
if ! command -v pg_ctlcluster >/dev/null; then
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q postgresql >&2
fi

VERSION="$(ls /usr/lib/postgresql | sort -V | tail -1)"
if ! pg_lsclusters -h | awk '{print $1, $2}' | grep -q "^$VERSION main$"; then
    pg_createcluster "$VERSION" main --port "$PORT" >&2
fi
if ! pg_lsclusters -h | awk '$1 == "'"$VERSION"'" && $2 == "main" {print $4}' | grep -q online; then
    pg_ctlcluster "$VERSION" main start >&2
fi
for _ in $(seq 50); do
    runuser -u postgres -- psql -p "$PORT" -tAc "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.2
done

psql_admin() { runuser -u postgres -- psql -p "$PORT" -v ON_ERROR_STOP=1 -tAc "$1"; }
if [[ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != "1" ]]; then
    psql_admin "CREATE ROLE \"$DB_USER\" LOGIN PASSWORD '$PASSWORD'" >/dev/null
fi
if [[ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]]; then
    psql_admin "CREATE DATABASE \"$DB\" OWNER \"$DB_USER\"" >/dev/null
fi
log "PostgreSQL $VERSION on 127.0.0.1:$PORT, database $DB"
echo "postgresql+psycopg://$DB_USER:$PASSWORD@127.0.0.1:$PORT/$DB"
