#!/usr/bin/env bash
# CA + serving cert for the apiserver + client certs (admin, controller-manager, scheduler, node) + SA key.
set -euo pipefail
cd "$(dirname "$0")/pki"
NODE=${NODE:-krspike-node}
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=krspike-ca" 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
sign() {  # name subject ext
  openssl req -newkey rsa:2048 -nodes -keyout $1.key -out $1.csr -subj "$2" 2>/dev/null
  printf '%s\n' "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $1.crt -days 2 -extfile $1.ext 2>/dev/null
}
sign apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.234.0.1
extendedKeyUsage=serverAuth"
sign admin "/O=system:masters/CN=krspike-admin" "extendedKeyUsage=clientAuth"
sign kcm "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
sign sched "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
sign node "/O=system:nodes/CN=system:node:$NODE" "extendedKeyUsage=clientAuth"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
sign kubelet "/CN=$NODE" "subjectAltName=IP:127.0.0.1,IP:${NODE_IP:-192.0.2.2},DNS:$NODE
extendedKeyUsage=serverAuth"
