#!/usr/bin/env bash
# etcd, kube-apiserver, controller-manager, scheduler on loopback; pids in $S/pids/
set -euo pipefail
. "$(dirname "$0")/env.sh"
mkdir -p $S/pids $S/logs $S/etcd-data
start() { local name=$1; shift; setsid "$@" >$S/logs/$name.log 2>&1 < /dev/null & echo $! > $S/pids/$name.pid; }
start etcd $CP/etcd --data-dir=$S/etcd-data --name=default --log-level=error \
  --listen-client-urls=http://127.0.0.1:$ETCD_CLIENT --advertise-client-urls=http://127.0.0.1:$ETCD_CLIENT \
  --listen-peer-urls=http://127.0.0.1:$ETCD_PEER --initial-advertise-peer-urls=http://127.0.0.1:$ETCD_PEER \
  --initial-cluster=default=http://127.0.0.1:$ETCD_PEER --unsafe-no-fsync=true --listen-metrics-urls=
start kube-apiserver $CP/kube-apiserver --etcd-servers=http://127.0.0.1:$ETCD_CLIENT \
  --bind-address=127.0.0.1 --secure-port=26443 --advertise-address=127.0.0.1 \
  --tls-cert-file=$S/pki/apiserver.crt --tls-private-key-file=$S/pki/apiserver.key \
  --client-ca-file=$S/pki/ca.crt --authorization-mode=Node,RBAC \
  --kubelet-client-certificate=$S/pki/apiserver-kubelet-client.crt --kubelet-client-key=$S/pki/apiserver-kubelet-client.key \
  --kubelet-certificate-authority=$S/pki/ca.crt --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file=$S/pki/sa.pub --service-account-signing-key-file=$S/pki/sa.key \
  --service-cluster-ip-range=10.234.0.0/24 --endpoint-reconciler-type=none --allow-privileged=true \
  --enable-admission-plugins=NodeRestriction --profiling=false --v=1
for i in $(seq 60); do
  curl -sf --cacert $S/pki/ca.crt --cert $S/pki/admin.crt --key $S/pki/admin.key $APISERVER/readyz >/dev/null && break; sleep 1
done
curl -sf --cacert $S/pki/ca.crt --cert $S/pki/admin.crt --key $S/pki/admin.key $APISERVER/readyz; echo " apiserver ready after ${i}s"
start kube-controller-manager $CP/kube-controller-manager --kubeconfig=$S/kubeconfig/kcm.yaml --leader-elect=false \
  --secure-port=0 --service-account-private-key-file=$S/pki/sa.key --root-ca-file=$S/pki/ca.crt \
  --use-service-account-credentials=true --cluster-signing-cert-file=$S/pki/ca.crt --cluster-signing-key-file=$S/pki/ca.key --v=1
start kube-scheduler $CP/kube-scheduler --kubeconfig=$S/kubeconfig/sched.yaml --leader-elect=false --secure-port=0 --v=1
