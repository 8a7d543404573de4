#!/usr/bin/env bash
# Install the system packages litecdc needs, only when they are missing.
# Today: a Python >= 3.11 with venv and pip, and etcd (cluster mode and its system tests).
# Later issues add Java, PostgreSQL…
set -euo pipefail

need=()
python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# Debian's etcd-server (3.4) provides /usr/bin/etcd; the tests start it on 127.0.0.1.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages: ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
