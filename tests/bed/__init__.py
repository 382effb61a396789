"""
The test bed: a Kubernetes cluster on a machine that has none (ARCHITECTURE.md, "The test bed").

- `control_plane`: a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from
  source by scripts/build-control-plane; `real_cluster` and `cluster_fixtures` (`cluster_session`,
  `kube`): the session's cluster, the operator's ServiceAccount, a namespace per test, the audit log.
  The operator's integration tests run on it.
- `kubelet_status`: the status a kubelet writes for a pod phase, for every bed that plays the kubelet.
- `k8s_emulator`: the emulated API server the end-to-end tests still use. KMock's Kubernetes emulator (`kmock.KubernetesEmulator`) with the
  fixes kopf, the `kubernetes` client and kubectl need (discovery, watches that resume, optimistic
  concurrency, garbage collection, ...), served over real HTTP by `EmulatedCluster`.
- `k8s_fixtures`: the pytest fixtures over it (`k8s_cluster`, `k8s_api`, `run_kopf`): a fresh
  emulated API server per test, and `run_kopf_in_thread`, kopf running an operator against it. Tests load them with
  `pytest_plugins = ["bed.k8s_fixtures"]`.
- `node_agent`: the kubelet. `NodeAgent` watches Pods through the emulator and runs each as podman
  containers, writing status back as a kubelet does.
- `cluster_bed`: the whole one-node cluster for end-to-end tests and benchmarks: emulator, node
  agent, the chart's CRD and RBAC, the operator as a Pod from its image, and on request Prometheus scraping it.

Modules of tests/ that are not stand-ins stay there and are shared with other tests: `tools` (the
helm and Prometheus binaries the bed deploys and scrapes with, also used by the chart and dashboard
tests) and `pod_security` (the Pod Security "restricted" checker). So the bed, like every test
module, is imported with tests/ on sys.path (as pytest puts it, and `bench/common.from_tests`).
"""
