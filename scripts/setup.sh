#!/usr/bin/env bash
# Everything a fresh machine needs: the virtualenv and the Debian tools the tests drive.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# The store tests start their own PostgreSQL; Debian keeps initdb and pg_ctl off PATH.
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    need_apt+=(postgresql)
fi
# The cluster tests start their own ZooKeeper from the Debian package's jars.
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# constraints.txt pins every package to the version the tests passed with.
.venv/bin/pip install -q -c constraints.txt -e '.[dev]'
# Spark's driver JVM maps its classes from an archive, its Python workers import PySpark as
# bytecode: a third less time and CPU per Spark run (src/onceflow/pipeline/driver.py). Optional.
.venv/bin/python -m onceflow.pipeline.driver || echo "Spark start-up not prepared: Spark starts as usual"
