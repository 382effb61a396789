# sourced by the spike scripts
S=/tmp/kubelet-spike
CP=/root/.cache/kuberl/control-plane/k8s-v1.37.2-etcd-v3.6.16/bin
KBIN=/root/.cache/kuberl/node-spike/k8s-v1.37.2/bin
CBIN=/root/.cache/kuberl/node-spike/containerd-v2.4.2/bin
NODE=krspike-node
APISERVER=https://127.0.0.1:26443
ETCD_CLIENT=23791; ETCD_PEER=23801
CSOCK=$S/containerd/run/containerd.sock
export KUBECONFIG=$S/kubeconfig/admin.yaml
export KUBECACHEDIR=$S/kubecache
