#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on loopback for the SQL fence tests. Idempotent.
#
#   eval "$(bash scripts/start-postgres.sh)"    # exports the two URLs below
#   bash scripts/start-postgres.sh --stop       # stops the server (data dir kept)
#
# stdout carries only two export lines; progress goes to stderr:
#
#   CONSENSUS_LEASE_POSTGRES_URL        postgresql+psycopg://...  (SQLAlchemy; the tests')
#   CONSENSUS_LEASE_POSTGRES_STORE_URL  postgresql://...          (open_store, psycopg)
#
# The SQLAlchemy URL is also written to "$PGDIR/url". The server listens on 127.0.0.1 only,
# on a non-default port, with its own data directory, socket directory and log:
#
#   CONSENSUS_LEASE_PG_DIR   state directory        default /tmp/consensus-lease-pg
#   CONSENSUS_LEASE_PG_PORT  TCP port on 127.0.0.1  default 55432
#
# Role and database `consensus_lease` (password `consensus_lease`: a test server, never
# reachable off this machine). Installs Debian's `postgresql` with apt-get when no server
# binaries are found and we are root. As root the server runs as the `postgres` user.
set -euo pipefail

PGDIR="${CONSENSUS_LEASE_PG_DIR:-/tmp/consensus-lease-pg}"
PORT="${CONSENSUS_LEASE_PG_PORT:-55432}"
NAME=consensus_lease
PASSWORD=consensus_lease
DATA="$PGDIR/data"
SOCKDIR="$PGDIR/run"
LOG="$PGDIR/server.log"
URL="postgresql+psycopg://$NAME:$PASSWORD@127.0.0.1:$PORT/$NAME"
STORE_URL="postgresql://$NAME:$PASSWORD@127.0.0.1:$PORT/$NAME"

say() { echo "start-postgres: $*" >&2; }

find_bindir() {
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
    fi
    # Debian keeps the server binaries off PATH, one directory per major version.
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
    done
    return 1
}

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing postgresql from Debian packages"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
        # Debian's package starts a cluster on the default port; we do not use it.
        BINDIR="$(find_bindir)"
    else
        say "no PostgreSQL server binaries (initdb, pg_ctl) and cannot install them (need root + apt-get)"
        exit 1
    fi
fi

# As root, the server must run as an unprivileged user.
if [ "$(id -u)" = 0 ]; then
    RUNAS=(runuser -u postgres --)
    OWNER=postgres
else
    RUNAS=()
    OWNER="$(id -un)"
fi
as_owner() { "${RUNAS[@]}" "$@"; }

if [ "${1:-}" = "--stop" ]; then
    if [ -f "$DATA/PG_VERSION" ]; then
        as_owner "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
    fi
    exit 0
fi

mkdir -p "$PGDIR" "$SOCKDIR"
chown "$OWNER" "$PGDIR" "$SOCKDIR"
chmod 700 "$PGDIR"

if [ ! -f "$DATA/PG_VERSION" ]; then
    say "initdb $DATA"
    rm -rf "$DATA"
    PWFILE="$PGDIR/.pw"
    echo "$PASSWORD" > "$PWFILE"
    chown "$OWNER" "$PWFILE"
    as_owner "$BINDIR/initdb" -D "$DATA" -U "$NAME" --pwfile="$PWFILE" \
        --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --no-locale >&2
    rm -f "$PWFILE"
fi

if as_owner "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    say "already running on 127.0.0.1:$PORT"
else
    say "starting on 127.0.0.1:$PORT (log $LOG)"
    touch "$LOG"; chown "$OWNER" "$LOG"
    as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $SOCKDIR -c max_connections=200 -c fsync=off" \
        start >&2 || { tail -n 30 "$LOG" >&2; exit 1; }
fi

# Wait (bounded) until it accepts connections, then report the URL.
for _ in $(seq 1 100); do
    if "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
        export PGPASSWORD="$PASSWORD"
        if [ -z "$("$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U "$NAME" -d postgres -tAc \
                "SELECT 1 FROM pg_database WHERE datname = '$NAME'")" ]; then
            say "creating database $NAME"
            "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U "$NAME" "$NAME" >&2
        fi
        echo "$URL" > "$PGDIR/url"
        echo "export CONSENSUS_LEASE_POSTGRES_URL=$URL"
        echo "export CONSENSUS_LEASE_POSTGRES_STORE_URL=$STORE_URL"
        exit 0
    fi
    sleep 0.1
done
say "server did not accept connections within 10 s"; tail -n 30 "$LOG" >&2
exit 1
