"""
The test bed: a Kubernetes cluster on a machine that has none (ARCHITECTURE.md, "The test bed").

- `common`: what every part shares: the repository, chart, release and Node names, `wait_until`,
  `free_port`, self-signed certificates, starting and stopping a host process, a build script's pin.
- `control_plane`: a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from
  source by scripts/build-control-plane; `real_cluster` and `cluster_fixtures` (`cluster_session`,
  `kube`): the session's cluster, the operator's ServiceAccount, a namespace per test, the audit log.
  The operator's integration tests run on it.
- `kubelet_status`: the status a kubelet writes for a pod phase, for every bed that plays the kubelet;
  `kubelet_api`: the requests a kubelet makes, as its node, and the Node's registration.
- `kopf_thread`: `run_kopf_in_thread`, kopf running an operator for real in a thread of the test.
- `fault_proxy`: an HTTPS proxy in front of the real API server that injects what the server will not
  produce on demand (a 500, a slow answer, a watch cut mid-stream).
- `node_agent`: the kubelet. `NodeAgent` registers a Node with the real API server as that node, runs
  the Pods the scheduler binds to it as podman containers (`podman`), one `pod_runner.PodRunner` each
  (its parts: `pod_containers`, `pod_readiness`, `pod_volumes`), writes their status as a kubelet does
  and serves their logs on the Node's kubelet port (`kubelet_server`: `kubectl logs` through the API
  server).
- `cluster_bed`: the whole one-node cluster for end-to-end tests and benchmarks: a control plane of its
  own listening on a podman network's gateway, the node agent, the chart installed with helm (the
  operator as its Deployment, with its ServiceAccount token), and on request Prometheus scraping it
  (`prometheus`) and Kueue (`kueue`: Kueue's own controller and webhooks, built by scripts/build-kueue)
  queueing it. `host_controller` runs such a third-party controller (Kueue, KubeRay's operator in
  `kuberay`) beside the API server.

Modules of tests/ that are not stand-ins stay there and are shared with other tests: `tools` (the
helm and Prometheus binaries the bed deploys and scrapes with, also used by the chart and dashboard
tests) and `pod_security` (the Pod Security "restricted" checker). So the bed, like every test
module, is imported with tests/ on sys.path (as pytest puts it, and `bench/common.from_tests`).
"""
