#!/usr/bin/env bash
# End to end from a clean state: certs, control plane, containerd, kubelet, one pod to Succeeded + a restricted Job.
# Needs the binaries built (kubelet-wrapper/build.sh, containerd-wrapper/build.sh) and images/python.tar (podman save).
set -euo pipefail
. "$(dirname "$0")/env.sh"
T0=$(date +%s.%N); ts() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }
"$S/stop-spike.sh" >/dev/null 2>&1 || true
rm -rf $S/etcd-data $S/containerd/root $S/containerd/state $S/containerd/run $S/containerd/runc $S/containerd/opt \
       $S/kubelet/root $S/kubelet/pki $S/cni/ipam $S/pod-logs $S/logs $S/pids $S/kubecache
mkdir -p $S/containerd/{root,state,run,opt} $S/cni/ipam $S/logs $S/pids
for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do sysctl $k; done > $S/sysctl-before.txt
ts "certs";               "$S/gen-certs.sh"; "$S/gen-kubeconfigs.sh"
ts "control plane";       "$S/start-control-plane.sh"
ts "cgroup root /krspike"; "$S/cgroup-root.sh"
ts "containerd + images + kubelet"; "$S/start-node.sh" 2>&1 | grep -v DEPRECATION
for i in $(seq 120); do
  [ "$($CP/kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break; sleep 0.5
done
ts "node Ready"
# the kubelet sets vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1 once at start (protectKernelDefaults: false): put them back
sed 's/ = /=/' $S/sysctl-before.txt | xargs sysctl -q -w
grep "Updating kernel flag" $S/logs/kubelet.log | sed 's/.*container_manager_linux.go:[0-9]*\] //' || true
$CP/kubectl apply -f $S/pod.yaml
for i in $(seq 240); do
  ph=$($CP/kubectl get pod hello -o jsonpath='{.status.phase}'); [ "$ph" = Succeeded ] || [ "$ph" = Failed ] && break; sleep 0.5
done
ts "pod hello: $ph"
$CP/kubectl apply -f $S/checks.yaml
$CP/kubectl wait --for=condition=complete job/restricted-job --timeout=120s
ts "restricted job complete"
$CP/kubectl wait --for=condition=Ready pod/server --timeout=60s
curl -s -o /dev/null -w "server pod IP 10.233.x: HTTP %{http_code}\n" "http://$($CP/kubectl get pod server -o jsonpath='{.status.podIP}'):8080/"
curl -s -o /dev/null -w "server hostPort 192.0.2.2:28080: HTTP %{http_code}\n" --max-time 5 http://192.0.2.2:28080/
$CP/kubectl exec server -- python3 -c "print('kubectl exec ok')"
$CP/kubectl get node -o wide
$CP/kubectl get pod -o wide
$CP/kubectl get pod hello -o jsonpath='{.status.phase} {.status.containerStatuses[0].state.terminated.reason} exit={.status.containerStatuses[0].state.terminated.exitCode}{"\n"}'
$CP/kubectl logs hello | head -2
for p in $($CP/kubectl get pod -l job-name=restricted-job -o name); do $CP/kubectl logs $p; done
ts "done"
