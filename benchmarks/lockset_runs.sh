#!/usr/bin/env bash
# The documented lock-set runs (`consensus-lease verify --workload lock-set`): Jepsen's
# parameters (5 workers, TTL 2 s, a random worker paused 3-5 s every 5 s, 90 s) on each
# server store in fenced mode, and the write-only-fenced control. One run at a time; the
# summaries go to benchmarks/results/lockset/ (results.md there is written by hand from
# them).
#
#   bash benchmarks/lockset_runs.sh                          # every run
#   bash benchmarks/lockset_runs.sh postgresql etcd          # some of them
#
# Needs: scripts/start-postgres.sh's server (PostgreSQL runs: the store in schema
# lockset_i28, the set in the SQL fence); the Docker engine and the kit's images
# (`make cluster-setup`) for the 3-member etcd and ZooKeeper clusters.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/lockset
RUNS=${LOCKSET_RUNS_DIR:-/tmp/consensus-lease-lockset-runs}
mkdir -p "$OUT" "$RUNS"
VERIFY=${VERIFY:-consensus-lease verify}

pg() {  # the store in schema lockset_i28, the set in the SQL fence
    eval "$(bash scripts/start-postgres.sh)"
    PG=(--backend "${CONSENSUS_LEASE_POSTGRES_STORE_URL}?schema=lockset_i28"
        --destination "$CONSENSUS_LEASE_POSTGRES_URL")
}

run() {
    local name=$1; shift
    rm -rf "${RUNS:?}/$name"
    echo "== $name: $VERIFY --workload lock-set $* ($(date +%T))"
    $VERIFY --workload lock-set "$@" --summary "$OUT/$name.json" --run-dir "$RUNS/$name" \
        > "$RUNS/$name.log" 2>&1
    echo "== $name: exit status $? ($(date +%T)); output in $RUNS/$name.log"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(postgresql etcd zookeeper postgresql-write-only)
for step in "${steps[@]}"; do
    case $step in
    postgresql)             pg; run "$step" "${PG[@]}" ;;
    postgresql-write-only)  pg; run "$step" "${PG[@]}" --mode write-only ;;
    etcd|zookeeper)         run "$step" --cluster "$step" ;;
    etcd-write-only)        run "$step" --cluster etcd --mode write-only ;;
    zookeeper-write-only)   run "$step" --cluster zookeeper --mode write-only ;;
    sqlite)                 run "$step" --cluster sqlite ;;
    *) echo "unknown run: $step" >&2; exit 2 ;;
    esac
done
