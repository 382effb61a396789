"""`kuberl-operator`: run the operator (kopf under the hood), or print the RBAC it needs.

    kuberl-operator [run] [--namespace NS ... | --all-namespaces] [--trainer-image IMAGE] [--rollout-image IMAGE]
                          [--metrics-port 8080] [--liveness-endpoint http://0.0.0.0:8081/healthz]
                          [--peering [NAME]] ...
    kuberl-operator rbac [--namespace NS] [--service-account NAME] [--service-account-namespace NS]

One replica is the deployment model: peering is off unless --peering is given.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kuberl.api.tenancy import Tenancy
from kuberl.operator import names, rbac
from kuberl.operator.builders import BuildOptions
from kuberl.operator.runtime import DEFAULT_LEARNER_METRICS_URL, OperatorConfig

log = logging.getLogger("kuberl.operator")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl-operator", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run the operator (the default command)",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeat for several; globs like team-* allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    run.add_argument("--trainer-image", default=names.DEFAULT_TRAINER_IMAGE,
                     help="image of the learner pods (torch) when a job sets no spec.image")
    run.add_argument("--rollout-image", default=names.DEFAULT_ROLLOUT_IMAGE,
                     help="image of the Ray head and rollout-worker pods (no torch) when a job sets no spec.image")
    run.add_argument("--image-pull-policy", default="IfNotPresent", choices=["Always", "IfNotPresent", "Never"])
    run.add_argument("--metrics-port", type=int, default=8080,
                     help="port of the operator's own /metrics (kuberl_operator_*); 0 turns it off")
    run.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics server binds")
    run.add_argument("--liveness-endpoint", default="http://0.0.0.0:8081/healthz",
                     help="kopf's liveness endpoint URL; empty turns it off")
    run.add_argument("--peering", nargs="?", const="kuberl-operator", default=None, metavar="NAME",
                     help="run with kopf peering under NAME (several replicas, one active); off by default")
    run.add_argument("--no-network-policies", dest="network_policies", action="store_false",
                     # %(default).0s prints nothing: "(default: True)" would read backwards here.
                     help="do not create the NetworkPolicies that keep Ray ports inside each job "
                          "(they are created by default)%(default).0s")
    run.add_argument("--reconcile-interval", type=float, default=10.0,
                     help="seconds between passes over an active job when no event wakes it")
    run.add_argument("--progress-interval", type=float, default=10.0,
                     help="seconds between reads of a running learner's /metrics into status.progress")
    run.add_argument("--learner-metrics-url", default=DEFAULT_LEARNER_METRICS_URL,
                     help="where to read a learner's metrics; placeholders {pod_ip} {port} {job} {namespace} "
                          "{metrics_service}")
    run.add_argument("--tenancy", default="{}", metavar="JSON",
                     help="what job pods may be per namespace beyond Pod Security 'restricted' with no "
                          "ServiceAccount: {\"NS\": {\"podSecurity\": \"baseline\", \"serviceAccounts\": [\"NAME\"]}}")
    run.add_argument("--operator-namespace", default=None, metavar="NS",
                     help="the operator's own namespace, where no job may run (default: $POD_NAMESPACE, else "
                          "the namespace of its in-cluster ServiceAccount)")
    run.add_argument("--api-threads", type=int, default=4,
                     help="threads for Kubernetes API calls (pods of many jobs are created concurrently)")
    run.add_argument("--log-format", default="full", choices=["plain", "full", "json"], help="log line format")
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    rb = sub.add_parser("rbac", help="print the RBAC manifests the operator needs (YAML)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    rb.add_argument("-n", "--namespace", default=None,
                    help="single-namespace variant (Role + RoleBinding in NS); cluster-wide when omitted")
    rb.add_argument("--name", default=rbac.DEFAULT_NAME, help="name of the (Cluster)Role and binding")
    rb.add_argument("--service-account", default=rbac.DEFAULT_NAME, help="the operator's ServiceAccount")
    rb.add_argument("--service-account-namespace", default=None,
                    help=f"its namespace, never NS (default: {rbac.DEFAULT_SERVICE_ACCOUNT_NAMESPACE})")
    rb.add_argument("--peering", action="store_true", help="add the rules kopf peering needs")
    return parser


#: Where a pod finds its own namespace (the ServiceAccount's, mounted by Kubernetes).
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace(args: argparse.Namespace) -> str | None:
    if args.operator_namespace:
        return args.operator_namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    try:
        tenancy = Tenancy.from_json(args.tenancy, operator_namespace(args))
    except ValueError as err:
        raise SystemExit(f"kuberl-operator: --tenancy: {err}") from None
    return OperatorConfig(
        tenancy=tenancy,
        build=BuildOptions(trainer_image=args.trainer_image, rollout_image=args.rollout_image,
                           image_pull_policy=args.image_pull_policy,
                           network_policies=args.network_policies),
        reconcile_interval=args.reconcile_interval,
        progress_interval=args.progress_interval,
        learner_metrics_url=args.learner_metrics_url,
        api_threads=args.api_threads,
    )


def kopf_options(args: argparse.Namespace) -> dict[str, Any]:
    """kopf.operator()'s arguments for the scope, peering and liveness flags."""
    clusterwide = args.all_namespaces or not args.namespace
    options: dict[str, Any] = {
        "standalone": args.peering is None,  # one replica: no peering unless asked for
        "clusterwide": clusterwide,
        "namespaces": [] if clusterwide else list(args.namespace),
        "liveness_endpoint": args.liveness_endpoint or None,
    }
    if args.peering is not None:
        options["peering_name"] = args.peering
    return options


def _run(args: argparse.Namespace) -> int:
    import kopf

    from kuberl.operator.controllers import build_registry, memo_for
    from kuberl.operator.metrics import OPERATOR_METRICS
    from kuberl.operator.runtime import Runtime

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    _preload_validation()
    if args.metrics_port:
        port = OPERATOR_METRICS.serve(args.metrics_port, args.metrics_address)
        log.info(f"operator metrics on http://{args.metrics_address}:{port}/metrics")
    runtime = Runtime(config_from_args(args))
    asyncio.run(kopf.operator(registry=build_registry(), memo=memo_for(runtime), **kopf_options(args)))
    return 0


def _preload_validation() -> None:
    """Read the table of registered environments now, not while the first job waits for its pods."""
    from kuberl.api.semantics import registered_envs

    registered_envs()


def _rbac(args: argparse.Namespace) -> int:
    account_namespace = args.service_account_namespace or rbac.DEFAULT_SERVICE_ACCOUNT_NAMESPACE
    if args.namespace:
        try:
            manifests = rbac.single_namespace(args.namespace, name=args.name, service_account=args.service_account,
                                              service_account_namespace=account_namespace, peering=args.peering)
        except ValueError as err:
            print(f"kuberl-operator rbac: {err}; give --service-account-namespace", file=sys.stderr)
            return 2
    else:
        manifests = rbac.cluster_wide(name=args.name, service_account=args.service_account,
                                      service_account_namespace=account_namespace, peering=args.peering)
    sys.stdout.write(rbac.render(manifests))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "rbac", "-h", "--help"):
        argv.insert(0, "run")
    args = _parser().parse_args(argv)
    return _rbac(args) if args.command == "rbac" else _run(args)


if __name__ == "__main__":
    sys.exit(main())
