#!/usr/bin/env bash
# containerd + images + kubelet. Needs start-control-plane.sh first.
set -euo pipefail
. "$(dirname "$0")/env.sh"
mkdir -p $S/pids $S/logs $S/pod-logs
start() { local name=$1; shift; setsid "$@" >$S/logs/$name.log 2>&1 < /dev/null & echo $! > $S/pids/$name.pid; }
export PATH=$CBIN:$PATH   # containerd finds containerd-shim-runc-v2 on PATH
start containerd $CBIN/containerd --config $S/containerd/config.toml
for i in $(seq 30); do [ -S $CSOCK ] && break; sleep 1; done
$CBIN/ctr --address $CSOCK version
$CBIN/ctr --address $CSOCK -n k8s.io images import --local $S/pause/pause-image.tar
$CBIN/ctr --address $CSOCK -n k8s.io images import --local --base-name docker.io/library/python $S/images/python.tar || \
  $CBIN/ctr --address $CSOCK -n k8s.io images import $S/images/python.tar
$CBIN/ctr --address $CSOCK -n k8s.io images ls -q
start kubelet $KBIN/kubelet --config=$S/kubelet/config.yaml --kubeconfig=$S/kubeconfig/node.yaml \
  --root-dir=$S/kubelet/root --cert-dir=$S/kubelet/pki --hostname-override=$NODE --node-ip=192.0.2.2 --v=2
