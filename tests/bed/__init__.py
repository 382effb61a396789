"""
The test bed: a Kubernetes cluster on a machine that has none (ARCHITECTURE.md, "The test bed").

- `common`: what every part shares: the repository, chart, release and Node names, `wait_until`,
  `free_port`, self-signed certificates, starting and stopping a host process, a build script's pin.
- `control_plane`: a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from
  source by scripts/build-control-plane; `real_cluster` and `cluster_fixtures` (`cluster_session`,
  `kube`): the session's cluster, the operator's ServiceAccount, a namespace per test, the audit log.
  The operator's integration tests run on it.
- `kubelet_status`: the status a kubelet writes for a pod phase, for the operator's integration tests,
  where the test plays the kubelet; `kubelet_api`: the requests a kubelet makes, as its node, and the
  Node's registration.
- `kopf_thread`: `run_kopf_in_thread`, kopf running an operator for real in a thread of the test.
- `fault_proxy`: an HTTPS proxy in front of the real API server that injects what the server will not
  produce on demand (a 500, a slow answer, a watch cut mid-stream).
- `real_node`: a real node (the kubelet, containerd with runc and the CNI plugins, kube-proxy, CoreDNS,
  kube-router), each in a network namespace of its own, two per machine: its configuration in
  `real_node_config`, what it changes on the machine and puts back in `real_node_host`, its containers and
  kept logs through containerd in `real_node_pods`; `registry` is the registry its images come from.
- `cluster_bed`: the whole one-node cluster for end-to-end tests and benchmarks: a control plane of its
  own listening on the host's end of the node's link, a real node, the chart installed with helm (the
  operator as its Deployment, with its ServiceAccount token), and on request Prometheus scraping it
  (`prometheus`) and Kueue (`kueue`: Kueue's own controller and webhooks, built by scripts/build-kueue)
  queueing it. `host_controller` runs such a third-party controller (Kueue, KubeRay's operator in
  `kuberay`) beside the API server.

Modules of tests/ that are not stand-ins stay there and are shared with other tests: `tools` (the
helm and Prometheus binaries the bed deploys and scrapes with, also used by the chart and dashboard
tests) and `pod_security` (the Pod Security "restricted" checker). So the bed, like every test
module, is imported with tests/ on sys.path (as pytest puts it, and `bench/common.from_tests`).
"""
