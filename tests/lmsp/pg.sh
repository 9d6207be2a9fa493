#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback for the LMSP tests and benchmarks.
#
#   eval "$(tests/lmsp/pg.sh start /tmp/acp-pg 54329)"   # exports ACP_SERVER_TEST_POSTGRES
#   make test
#   tests/lmsp/pg.sh stop /tmp/acp-pg
#   tests/lmsp/pg.sh restart /tmp/acp-pg        # pg_ctl restart -m fast (outage tests)
#   tests/lmsp/pg.sh crash /tmp/acp-pg          # pg_ctl stop -m immediate (a crash)
#
# start: initdb (as the `postgres` user when run as root) in DIR/data, pg_ctl start on
# 127.0.0.1:PORT only, sockets in DIR/sock, trust auth, fsync on; creates database
# acp_test; prints `export ACP_SERVER_TEST_POSTGRES=postgresql://postgres@127.0.0.1:PORT/acp_test`.
# Exits non-zero (printing nothing on stdout) when a step fails. stop: pg_ctl stop -m fast.
set -euo pipefail

cmd=${1:?usage: pg.sh start|stop DIR [PORT]}
dir=${2:?usage: pg.sh start|stop DIR [PORT]}
port=${3:-54329}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] && [ -x "$bin/initdb" ] || { echo "pg.sh: no PostgreSQL binaries" >&2; exit 1; }

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "$cmd" in
start)
    mkdir -p "$dir/sock"
    if [ "$(id -u)" = 0 ]; then chown -R postgres: "$dir"; fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
            --no-instructions >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/sock -c max_connections=300 \
            -c shared_buffers=64MB" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -q -tA -c \
        "SELECT 1 FROM pg_database WHERE datname = 'acp_test'" postgres | grep -q 1 \
        || as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres acp_test
    echo "export ACP_SERVER_TEST_POSTGRES=postgresql://postgres@127.0.0.1:$port/acp_test"
    ;;
stop)
    [ -f "$dir/data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2
    ;;
crash)
    # -m immediate: every backend quits at once (SIGQUIT) without releasing its locks
    # to a waiter, as in a crash of the server; the next start recovers from the WAL
    [ -f "$dir/data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >&2
    ;;
restart)
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 30 restart >&2
    ;;
*)
    echo "usage: pg.sh start|stop|restart|crash DIR [PORT]" >&2
    exit 2
    ;;
esac
