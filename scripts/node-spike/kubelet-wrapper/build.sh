#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")"
export GOMODCACHE=/root/.cache/kuberl/go/mod GOCACHE=/root/.cache/kuberl/go/build GOFLAGS=-modcacherw GOWORK=off CGO_ENABLED=0 GOTOOLCHAIN=local
K8S_VERSION=v1.37.2; minor=37
BIN=/root/.cache/kuberl/node-spike/k8s-$K8S_VERSION/bin
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
go mod edit -tool=k8s.io/kubernetes/cmd/kubelet go.mod
t0=$(date +%s); go mod tidy; echo "tidy: $(( $(date +%s)-t0 ))s"
t0=$(date +%s)
go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$LD" -o "$BIN/kubelet" k8s.io/kubernetes/cmd/kubelet
echo "kubelet build: $(( $(date +%s)-t0 ))s"
"$BIN/kubelet" --version
