#!/usr/bin/env bash
# create (or with "rm", remove) the kubelet's cgroupRoot /krspike in every cgroup v1 hierarchy
set -euo pipefail
for h in /sys/fs/cgroup/*/; do
  h=${h%/}
  if [ "${1:-}" = rm ]; then   # runc also makes the pod cgroups in the hybrid layout's unified hierarchy
    [ -d $h/krspike ] && find $h/krspike -depth -type d -exec rmdir {} \; 2>/dev/null || true
  elif [ "$h" != /sys/fs/cgroup/unified ]; then
    mkdir -p $h/krspike
    if [ -f $h/cpuset.cpus ]; then cat $h/cpuset.cpus > $h/krspike/cpuset.cpus; cat $h/cpuset.mems > $h/krspike/cpuset.mems; fi
  fi
done
