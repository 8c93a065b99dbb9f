#!/usr/bin/env bash
# Registers the control plane's namespace (unless it exists) and the search attributes its
# workflows carry (workflows/search-attributes.ts; SQL visibility offers ten Keyword slots per
# namespace, and these are ten), with the Temporal CLI against the cluster's frontend. Safe to run
# again. TLS comes from the same variables the control plane reads.
#
#   TEMPORAL_CLI=temporal TEMPORAL_ADDRESS=temporal.internal:7233 TEMPORAL_NAMESPACE=compute \
#   TEMPORAL_TLS=true TEMPORAL_TLS_CA_PATH=ca.pem deploy/temporal/register-namespace.sh
set -euo pipefail
cli="${TEMPORAL_CLI:-temporal}"
namespace="${TEMPORAL_NAMESPACE:-default}"
flags=(--address "${TEMPORAL_ADDRESS:-127.0.0.1:7233}" --namespace "$namespace" --color never)
if [ "${TEMPORAL_TLS:-false}" = "true" ]; then
  flags+=(--tls)
  [ -n "${TEMPORAL_TLS_CA_PATH:-}" ] && flags+=(--tls-ca-path "$TEMPORAL_TLS_CA_PATH")
  [ -n "${TEMPORAL_TLS_CERT_PATH:-}" ] && flags+=(--tls-cert-path "$TEMPORAL_TLS_CERT_PATH")
  [ -n "${TEMPORAL_TLS_KEY_PATH:-}" ] && flags+=(--tls-key-path "$TEMPORAL_TLS_KEY_PATH")
  [ -n "${TEMPORAL_TLS_SERVER_NAME:-}" ] && flags+=(--tls-server-name "$TEMPORAL_TLS_SERVER_NAME")
fi

if ! "$cli" operator namespace describe "${flags[@]}" >/dev/null 2>&1; then
  "$cli" operator namespace create "${flags[@]}" --retention "${TEMPORAL_RETENTION:-72h}" >/dev/null
fi
# Names as in workflows/search-attributes.ts (tests/cluster checks they agree), all Keyword. The CLI
# pairs the n-th --name with the n-th --type: each name needs its own --type.
names=(ComputeTenant ComputePool ComputeState ComputeReservation ComputeRelease ComputeWave
  ComputeNode ComputeSite ComputeProfile ComputeStep)
pairs=()
for name in "${names[@]}"; do pairs+=(--name "$name" --type Keyword); done
# Fails when an earlier run registered some of them already: what counts is the list below.
out=$("$cli" operator search-attribute create "${flags[@]}" "${pairs[@]}" 2>&1) || true
listed=$("$cli" operator search-attribute list "${flags[@]}")
for name in "${names[@]}"; do
  if ! grep -qw "$name" <<<"$listed"; then
    echo "search attribute $name is not registered on namespace $namespace: $out" >&2
    exit 1
  fi
done
echo "namespace $namespace: search attributes registered"
