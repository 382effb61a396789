#!/usr/bin/env bash
# Stop and undo everything the spike started/changed. Only touches what it started (pid files) or named (krspike).
. "$(dirname "$0")/env.sh"
kc() { $CP/kubectl "$@"; }
pidof_file() { [ -f $S/pids/$1.pid ] && cat $S/pids/$1.pid; }
stop() {  # stop NAME: TERM, wait, KILL
  local p; p=$(pidof_file $1) || return 0
  if kill -0 $p 2>/dev/null; then kill $p; for i in $(seq 20); do kill -0 $p 2>/dev/null || break; sleep 0.5; done; kill -9 $p 2>/dev/null; fi
  rm -f $S/pids/$1.pid
}
# 1. pods away while kubelet + containerd still run, so CNI DEL runs (bridge ipMasq chains, portmap chains, IPAM)
if [ -f $S/pids/kubelet.pid ] && kill -0 "$(pidof_file kubelet)" 2>/dev/null; then
  kc delete pods --all -A --grace-period=1 --wait=true --timeout=60s 2>&1 | tail -2
fi
stop kubelet
# 2. any sandbox left: via CRI is gone with kubelet, so remove through ctr (no CNI DEL then)
if [ -S $CSOCK ]; then
  for t in $($CBIN/ctr --address $CSOCK -n k8s.io tasks ls -q 2>/dev/null); do $CBIN/ctr --address $CSOCK -n k8s.io tasks kill -s KILL $t; done
  sleep 1
fi
stop containerd
# shims of our containerd (they carry -address $CSOCK); by pid, never by name
for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $CSOCK" || true); do kill -9 $p 2>/dev/null; done
# mounts under our dirs (rootfs overlays, sandbox shm, netns bind mounts)
grep -o " $S/[^ ]*" /proc/mounts | sort -r | while read m; do umount -l "$m" 2>/dev/null; done
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop $c; done
# network: our bridge; kubelet's own iptables chains (ipv4 + ipv6)
ip link del krspike0 2>/dev/null
for ipt in iptables ip6tables; do
  $ipt -w -D INPUT -j KUBE-FIREWALL 2>/dev/null; $ipt -w -D OUTPUT -j KUBE-FIREWALL 2>/dev/null
  $ipt -w -F KUBE-FIREWALL 2>/dev/null; $ipt -w -X KUBE-FIREWALL 2>/dev/null
  for t in mangle filter nat; do $ipt -w -t $t -X KUBE-KUBELET-CANARY 2>/dev/null; done
  $ipt -w -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null
done
# per-container CNI chains of our network (comment name: "krspike"), if a pod was not torn down through CNI
iptables-save -t nat | grep -- '-A POSTROUTING .*name: \\"krspike\\"' | sed 's/^-A /-D /' | while read -r r; do eval iptables -w -t nat $r; done
# kubelet's hard-coded host paths
find /var/log/containers -maxdepth 1 -lname "$S/*" -delete 2>/dev/null
rmdir /var/log/containers 2>/dev/null
rm -f /var/lib/kubelet/device-plugins/kubelet.sock; rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
# containerd's hard-coded /run/containerd/s (shim sockets) and runc root default
rmdir /run/containerd/s /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd 2>/dev/null
# cgroups
"$S/cgroup-root.sh" rm
# the sysctls kubelet changes at start (restored by run-spike.sh already; again here in case)
[ -f $S/sysctl-before.txt ] && sed 's/ = /=/' $S/sysctl-before.txt | grep -E "overcommit|panic" | xargs sysctl -q -w
echo "stopped"
