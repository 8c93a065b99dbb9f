#!/usr/bin/env bash
# Creates (or brings up to date) Temporal's two PostgreSQL databases: the default store and the
# visibility store, with the schemas embedded in temporal-sql-tool (the server's `cmd/tools/sql`).
# Safe to run again: an existing database is kept and only pending schema versions are applied.
#
#   TEMPORAL_SQL_TOOL=/path/to/sql TEMPORAL_DB_HOST=db.internal TEMPORAL_DB_PORT=5432 \
#   TEMPORAL_DB_USER=temporal TEMPORAL_DB_PASSWORD=... deploy/temporal/setup-schema.sh
set -euo pipefail
tool="${TEMPORAL_SQL_TOOL:?set TEMPORAL_SQL_TOOL to temporal-sql-tool (npx tsx scripts/cluster-tools.ts builds it)}"
common=(
  --plugin postgres12
  --endpoint "${TEMPORAL_DB_HOST:-127.0.0.1}"
  --port "${TEMPORAL_DB_PORT:-5432}"
  --user "${TEMPORAL_DB_USER:-temporal}"
  --password "${TEMPORAL_DB_PASSWORD:-}"
)
if [ "${TEMPORAL_DB_TLS:-false}" = "true" ]; then
  common+=(--tls)
  [ -n "${TEMPORAL_DB_TLS_CA_FILE:-}" ] && common+=(--tls-ca-file "$TEMPORAL_DB_TLS_CA_FILE")
fi

setup() {
  local database="$1" schema="$2" out
  if ! out=$("$tool" "${common[@]}" --database "$database" create-database 2>&1); then
    # An existing database is what a second run finds: anything else is a real failure.
    if ! grep -q 'already exists' <<<"$out"; then
      echo "$out" >&2
      exit 1
    fi
  fi
  "$tool" "${common[@]}" --database "$database" setup-schema --version 0.0 >/dev/null
  "$tool" "${common[@]}" --database "$database" update-schema --schema-name "$schema" >/dev/null
  echo "$database: schema $schema is up to date"
}

setup "${TEMPORAL_DB:-temporal}" postgresql/v12/temporal
setup "${TEMPORAL_VISIBILITY_DB:-temporal_visibility}" postgresql/v12/visibility
