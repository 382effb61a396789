#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")"
export GOMODCACHE=/root/.cache/kuberl/go/mod GOCACHE=/root/.cache/kuberl/go/build GOFLAGS=-modcacherw GOWORK=off CGO_ENABLED=0 GOTOOLCHAIN=local
V=v2.4.2
BIN=/root/.cache/kuberl/node-spike/containerd-$V/bin
rm -f go.mod go.sum
go mod init local/kuberl-containerd-spike
t0=$(date +%s)
for c in containerd ctr containerd-shim-runc-v2; do go get -tool github.com/containerd/containerd/v2/cmd/$c@$V; done
echo "get: $(( $(date +%s)-t0 ))s"
P=github.com/containerd/containerd/v2
LD="-s -w -X $P/version.Version=$V -X $P/version.Revision=spike -X $P/version.Package=github.com/containerd/containerd/v2"
t0=$(date +%s)
go build -trimpath -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" -ldflags "$LD" -o "$BIN/" $P/cmd/containerd $P/cmd/ctr $P/cmd/containerd-shim-runc-v2
echo "containerd build: $(( $(date +%s)-t0 ))s"
"$BIN/containerd" --version; "$BIN/ctr" --version
