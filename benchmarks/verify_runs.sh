#!/usr/bin/env bash
# The documented `consensus-lease verify` runs: at least 10,000 claims per store under
# its full fault menu, and each one's --unfenced control. One run at a time (each takes
# minutes on 2 cores); the summaries go to benchmarks/results/verify/ and
# benchmarks/verify_table.py writes results.md from them.
#
#   bash benchmarks/verify_runs.sh                     # all eight runs
#   bash benchmarks/verify_runs.sh sqlite etcd-unfenced   # some of them
#
# Needs: scripts/start-postgres.sh's server (PostgreSQL runs); the Docker engine and the
# kit's images (`make cluster-setup`), and root for the partition fault (etcd, ZooKeeper).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/verify
RUNS=${VERIFY_RUNS_DIR:-/tmp/consensus-lease-verify-runs}
mkdir -p "$OUT" "$RUNS"
VERIFY=${VERIFY:-consensus-lease verify}
# 4 workers: each claim costs about a store call per job other workers hold, so more
# workers on 2 cores give fewer claims per second, not more. A short fixed think time
# makes the work CPU-bound. --until-done with a --duration-s longer than the work takes
# at the store's rate (30-60 claims/s here, less on a busy machine) puts every claim
# under faults and ends the fault period when the last job is completed.
BIG="--workers 4 --jobs 10000 --steps 2 --think-s 0.02 --quiet-s 300 --seed 1 --until-done"
CONTROL="--workers 4 --jobs 1000 --steps 2 --think-s 0.02 --quiet-s 120 --seed 1 --unfenced"

pg_url() {
    eval "$(bash scripts/start-postgres.sh)"
    echo "${CONSENSUS_LEASE_POSTGRES_URL/postgresql+psycopg/postgresql}?schema=verify_i29"
}

run() {
    local name=$1; shift
    rm -rf "${RUNS:?}/$name"
    echo "== $name: $VERIFY $* ($(date +%T))"
    $VERIFY "$@" --summary "$OUT/$name.json" --run-dir "$RUNS/$name" > "$RUNS/$name.log" 2>&1
    echo "== $name: exit status $? ($(date +%T)); output in $RUNS/$name.log"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(sqlite sqlite-unfenced postgresql postgresql-unfenced
                                 etcd etcd-unfenced zookeeper zookeeper-unfenced)
for step in "${steps[@]}"; do
    case $step in
    sqlite)              run "$step" --cluster sqlite $BIG --ttl-s 1 --duration-s 900 ;;
    sqlite-unfenced)     run "$step" --cluster sqlite $CONTROL --ttl-s 1 --duration-s 30 ;;
    postgresql)          run "$step" --backend "$(pg_url)" $BIG --ttl-s 1 --duration-s 900 ;;
    postgresql-unfenced) run "$step" --backend "$(pg_url)" $CONTROL --ttl-s 1 --duration-s 30 ;;
    etcd)                run "$step" --cluster etcd $BIG --ttl-s 2 --duration-s 1200 ;;
    etcd-unfenced)       run "$step" --cluster etcd $CONTROL --ttl-s 2 --duration-s 60 ;;
    zookeeper)           run "$step" --cluster zookeeper $BIG --ttl-s 2 --duration-s 1200 ;;
    zookeeper-unfenced)  run "$step" --cluster zookeeper $CONTROL --ttl-s 2 --duration-s 90 \
                             --jobs 2000 ;;  # later --jobs wins: work for the 90 s
    *) echo "unknown run: $step" >&2; exit 2 ;;
    esac
done
