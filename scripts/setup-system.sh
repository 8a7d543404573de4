#!/usr/bin/env bash
# Install the system packages litecdc needs, only when they are missing.
# - a Python >= 3.11 with venv and pip;
# - etcd (cluster mode and its system tests);
# - a JDK for Spark (the pipeline), and Debian's SQLite JDBC driver (benchmark baseline);
# - PostgreSQL, MariaDB, NATS (JetStream) and RabbitMQ servers: the tests start their own
#   throwaway instances from these binaries, so the packages' system services are kept
#   from starting (policy-rc.d during the install) and disabled afterwards.
set -euo pipefail

have_glob() { compgen -G "$1" >/dev/null; }

need=()
python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# Debian's etcd-server (3.4) provides /usr/bin/etcd; the tests start it on 127.0.0.1.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# Spark 4 needs Java 17+; only the runtime is needed.
java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || need+=(openjdk-17-jre-headless)
# Debian installs the server binaries under /usr/lib/postgresql/<major>/bin (not on PATH).
have_glob '/usr/lib/postgresql/*/bin/postgres' && have_glob '/usr/lib/postgresql/*/bin/initdb' \
  || need+=(postgresql)
{ command -v mariadbd || command -v mysqld || [ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ]; } \
  >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 || need+=(mariadb-server)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
{ command -v rabbitmq-server || [ -x /usr/sbin/rabbitmq-server ]; } >/dev/null 2>&1 \
  || need+=(rabbitmq-server)
[ -e /usr/share/java/sqlite-jdbc.jar ] || need+=(libxerial-sqlite-jdbc-java)
have_glob '/usr/lib/*/jni/libsqlitejdbc.so' || have_glob '/usr/lib/jni/libsqlitejdbc.so' \
  || need+=(libxerial-sqlite-jdbc-jni)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
# as root, or through sudo (which may ask for a password) when a user runs make
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing system packages: ${need[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "setup: missing system packages: ${need[*]}; installing them with sudo" >&2
  as_root=(sudo)
fi

# Keep the packages' services from starting during the install: invoke-rc.d and
# deb-systemd-invoke ask /usr/sbin/policy-rc.d, and exit status 101 means "don't".
# An existing policy-rc.d (e.g. a container's) is put back afterwards.
policy=/usr/sbin/policy-rc.d
backup=""
if [ -e "$policy" ]; then
  backup="$(mktemp)"
  "${as_root[@]}" cp -p "$policy" "$backup"
fi
restore_policy() {
  if [ -n "$backup" ]; then
    "${as_root[@]}" mv -f "$backup" "$policy"
  else
    "${as_root[@]}" rm -f "$policy"
  fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
"${as_root[@]}" chmod 755 "$policy"

echo "setup: installing ${need[*]}" >&2
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${need[@]}"

# Don't let the servers just installed start at the next boot either (systemd machines only);
# services that were there before are left alone. The tests run their own instances.
if [ -d /run/systemd/system ]; then
  for pkg in "${need[@]}"; do
    case "$pkg" in
      postgresql) units=(postgresql) ;;
      mariadb-server) units=(mariadb) ;;
      nats-server) units=(nats-server) ;;
      rabbitmq-server) units=(rabbitmq-server epmd.socket epmd.service) ;;
      *) units=() ;;
    esac
    for unit in "${units[@]}"; do
      "${as_root[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
  done
fi
