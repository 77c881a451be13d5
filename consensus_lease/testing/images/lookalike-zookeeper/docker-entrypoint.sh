#!/bin/sh
# Entrypoint of the look-alike image. Behaves as the official `zookeeper` image's
# entrypoint is documented to:
#   * started as root with the default command, it gives the data, log and config
#     directories to the `zookeeper` user and runs itself again as that user (and that
#     user's group: a gid given with `docker run --user 0:GID` is lost);
#   * on the first start it writes $ZOO_CONF_DIR/zoo.cfg from the ZOO_* variables and
#     $ZOO_DATA_DIR/myid from ZOO_MY_ID (default 1); later starts keep both files;
#   * then it runs its arguments (default: zkServer.sh start-foreground).
set -eu
set -f  # ZOO_SERVERS and ZOO_CFG_EXTRA are split on blanks, never globbed

if [ "${1:-}" = zkServer.sh ] && [ "$(id -u)" = 0 ]; then
    chown -R zookeeper "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR" "$ZOO_CONF_DIR"
    exec setpriv --reuid=zookeeper --regid=zookeeper --init-groups "$0" "$@"
fi

config="$ZOO_CONF_DIR/zoo.cfg"
if [ ! -f "$config" ]; then
    {
        echo "dataDir=$ZOO_DATA_DIR"
        echo "dataLogDir=$ZOO_DATA_LOG_DIR"
        echo "tickTime=$ZOO_TICK_TIME"
        echo "initLimit=$ZOO_INIT_LIMIT"
        echo "syncLimit=$ZOO_SYNC_LIMIT"
        echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
        echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
        echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
        echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
        echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
        if [ -n "${ZOO_4LW_COMMANDS_WHITELIST:-}" ]; then
            echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST"
        fi
        for line in ${ZOO_CFG_EXTRA:-}; do
            echo "$line"
        done
        if [ -n "${ZOO_SERVERS:-}" ]; then
            for server in $ZOO_SERVERS; do
                echo "$server"
            done
        else
            echo "server.1=localhost:2888:3888;2181"
        fi
    } > "$config"
fi

if [ ! -f "$ZOO_DATA_DIR/myid" ]; then
    echo "${ZOO_MY_ID:-1}" > "$ZOO_DATA_DIR/myid"
fi

exec "$@"
