#!/usr/bin/env bash
# Idempotent install of a single-node Slurm (with accounting) from Debian's packages.
# Skips apt entirely when every package is already installed.
set -euo pipefail

PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge slurmdbd slurm-wlm-mysql-plugin
          mariadb-server)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install.sh: all Slurm packages already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "install.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep package post-install scripts from starting daemons (no systemd here anyway;
# start.sh runs them directly).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    created_policy=1
fi
cleanup() { if [ "$created_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install.sh: done"
