#!/usr/bin/env bash
set -euo pipefail
. "$(dirname "$0")/env.sh"
mkdir -p $S/kubeconfig
for who in admin kcm sched node; do
  f=$S/kubeconfig/$who.yaml
  cat > $f <<EOK
apiVersion: v1
kind: Config
clusters:
- name: spike
  cluster: {server: $APISERVER, certificate-authority: $S/pki/ca.crt}
users:
- name: $who
  user: {client-certificate: $S/pki/$who.crt, client-key: $S/pki/$who.key}
contexts:
- name: spike
  context: {cluster: spike, user: $who}
current-context: spike
EOK
done
