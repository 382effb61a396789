"""`kuberl`: check a job or sweep file, train a job (locally or as a cluster learner), run a sweep, print a CRD.

Exit status: 0 success, 2 invalid input (nothing started), 1 a failure while training.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports the trainer only for the command that trains
    from kuberl.trainer.run import TrainOptions


def _print_problems(err) -> None:
    """Print every problem; in a learner pod also leave them as the container's termination message,
    which the operator turns into the job's `InvalidSpec` status."""
    text = err.report()
    print(text, file=sys.stderr)
    from kuberl.trainer.metrics import write_termination_message

    write_termination_message(text)


def _is_sweep_file(path: str) -> bool:
    """Whether a file says `kind: RLSweep` at the top level: `kuberl validate` judges it as a sweep."""
    import re

    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return False  # the job loader reports the unreadable file
    return re.search(r"^kind:\s*[\"']?RLSweep[\"']?\s*(#.*)?$", head, re.MULTILINE) is not None


def _tenancy(args: argparse.Namespace):
    """`kuberl validate`'s --pod-security, --service-account and --identity-key: whatever namespace the file
    names gets the allowance they describe, as the operator would give it (the chart's tenancy.namespaces)."""
    from kuberl.api import cloud_identity
    from kuberl.api.tenancy import Allowance, Tenancy

    unknown = [key for key in args.identity_key if not cloud_identity.grants(key)]
    if unknown:
        raise SystemExit(f"error: --identity-key {', '.join(unknown)}: not a label or annotation the operator refuses "
                         f"as cloud identity (a key, or a prefix ending in '/', under one of "
                         f"{', '.join(cloud_identity.IDENTITY_KEYS)})")
    return Tenancy(default=Allowance(args.pod_security, frozenset(args.service_account),
                                     frozenset(args.identity_key)))


def _cmd_validate(args: argparse.Namespace) -> int:
    if _is_sweep_file(args.job):
        sweep = _load_sweep(args.job, tenancy=_tenancy(args))
        return 2 if sweep is None else _sweep_ok(sweep)
    from kuberl.api.load import InvalidJob, load_job_file
    from kuberl.trainer.envs.resolve import check_environment

    tenancy = _tenancy(args)
    try:
        job = load_job_file(args.job, check=check_environment, tenancy=tenancy)
    except InvalidJob as err:
        _print_problems(err)
        return 2
    spec = job.spec
    print(
        f"ok: {job.metadata.name} — {spec.algorithm.name.value} on {spec.environment.id}, "
        f"{spec.rollout_workers.replicas} worker(s) x {spec.rollout_workers.envs_per_worker} env(s)"
    )
    if args.server:
        return _validate_on_server(args, job)
    return 0


def _validate_on_server(args: argparse.Namespace, job) -> int:
    """`--server`: the job and everything the operator would create for it, as server-side dry runs in the
    current kube context (kuberl.operator.server_check); nothing is created."""
    import yaml

    from kuberl.api.load import InvalidJob

    try:
        import kubernetes

        from kuberl.operator import server_check
    except ImportError:
        print("error: --server needs the Kubernetes client: pip install 'kuberl[operator]'", file=sys.stderr)
        return 2
    try:
        contexts, current = kubernetes.config.list_kube_config_contexts()
        context = current if args.context is None else next(c for c in contexts if c["name"] == args.context)
        api = kubernetes.config.new_client_from_config(context=args.context)
    except (kubernetes.config.ConfigException, StopIteration, OSError) as err:
        print(f"error: --server needs a kube context (kubectl config current-context): {err}", file=sys.stderr)
        return 2
    with open(args.job, encoding="utf-8") as f:
        body = yaml.safe_load(f)
    # As kubectl apply would place it: the file's namespace, else the context's.
    namespace = (args.namespace or (body.get("metadata") or {}).get("namespace")
                 or context.get("context", {}).get("namespace") or "default")
    try:
        problems = server_check.check(api, body, namespace)
    except (kubernetes.client.exceptions.OpenApiException, OSError) as err:
        print(f"error: cannot reach the API server of context {context['name']}: {err}", file=sys.stderr)
        return 1
    finally:
        api.close()
    if problems:
        _print_problems(InvalidJob(problems, args.job))
        return 2
    print(f"ok: the API server of context {context['name']} accepts {job.metadata.name} in namespace {namespace} "
          "and everything the operator would create for it (a dry run: nothing was created)")
    return 0


def _read_bounded(path: str, limit: int) -> str:
    """A learner pod's job file (the operator's ConfigMap), read to one byte past the job limit: a longer
    file is refused by the size check, not read whole."""
    from kuberl.api.load import InvalidJob, Problem

    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise InvalidJob([Problem("<file>", f"cannot read the job file {path}: {err.strerror}", has_value=False)],
                         path) from None
    return data.decode("utf-8", errors="replace")


def _cmd_crd(args: argparse.Namespace) -> int:
    from kuberl.api.crd import crd_yaml, sweep_crd_yaml

    text = sweep_crd_yaml() if args.kind == "RLSweep" else crd_yaml()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


#: The flags of `train` and `learner` that set a spec field: the job is validated with them in place, by
#: the same rules as a job file, and a problem names the flag.
SPEC_FLAGS = {
    "--workers": ("spec.rolloutWorkers.replicas", int, "rollout workers"),
    "--metrics-port": ("spec.metrics.port", int, "metrics port (0 = pick a free port)"),
    "--max-env-steps": ("spec.stopping.maxEnvSteps", int, "stop after this many env steps"),
    "--seed": ("spec.seed", int, "random seed"),
    "--device": ("spec.learner.device", str, "learner device: auto, cpu or cuda"),
}


def _overrides(args: argparse.Namespace) -> tuple:
    from kuberl.api.load import Override

    given = ((flag, path, getattr(args, flag[2:].replace("-", "_"))) for flag, (path, _, _) in SPEC_FLAGS.items())
    return tuple(Override(flag, tuple(path.split(".")), value) for flag, path, value in given if value is not None)


def train_options(args: argparse.Namespace) -> TrainOptions:
    """How `kuberl train` / `kuberl learner` runs the job here, from its flags and the pod's environment."""
    from kuberl.trainer.run import TrainOptions

    return TrainOptions(  # (the SPEC_FLAGS are in job.spec already)
        run_dir=Path(args.run_dir) if args.run_dir else None,
        resume=args.resume,
        ray_address=args.ray_address or os.environ.get("KUBERL_RAY_ADDRESS"),
        ship_import_path=getattr(args, "command", None) != "learner",
        progress=not args.no_progress and sys.stderr.isatty(),
        started_at=_process_start(),
        # A whole `kuberl train` process leaves by os._exit below and its embedded Ray goes with it
        # (`stop_local_ray_after_exit`), instead of stopping Ray's processes one by one (about 1.5 s).
        exit_after=getattr(args, "exit_when_done", False),
    )


def _cmd_train(args: argparse.Namespace) -> int:
    from kuberl.api.load import (
        MAX_JOB_BYTES,
        InvalidJob,
        load_job_bytes,
        load_job_file,
        parse_with_overrides,
        read_job_json,
    )
    from kuberl.trainer.envs.resolve import check_environment

    overrides = _overrides(args)
    try:
        if args.job == "-" or args.job is None:
            spec_file = os.environ.get("KUBERL_JOB_SPEC_FILE")
            if args.job is None and spec_file:
                data = read_job_json(_read_bounded(spec_file, MAX_JOB_BYTES), "$KUBERL_JOB_SPEC_FILE")
                # Named as the operator names it: the job's status quotes this text.
                name = (data.get("metadata") or {}).get("name") if isinstance(data, dict) else None
                job = parse_with_overrides(data, overrides, source=name or "$KUBERL_JOB_SPEC_FILE",
                                           check=check_environment)
            elif args.job == "-":
                job = load_job_bytes(sys.stdin.buffer.read(MAX_JOB_BYTES + 1), source="<stdin>",
                                     overrides=overrides, check=check_environment)
            else:
                print("error: give a job file (or set KUBERL_JOB_SPEC_FILE in a learner pod)", file=sys.stderr)
                return 2
        else:
            job = load_job_file(args.job, overrides=overrides, check=check_environment)
    except InvalidJob as err:
        _print_problems(err)
        return 2

    from kuberl.api.problems import INVALID_SPEC_EXIT_CODE, Problem
    from kuberl.trainer.checkpoint_store import CheckpointStoreRefused
    from kuberl.trainer.envs.resolve import EnvNotFound
    from kuberl.trainer.run import train

    options = train_options(args)
    try:
        result = train(job, options)
    except EnvNotFound as err:  # a rollout worker's image lacks what this process's has: the job cannot run
        _print_problems(InvalidJob([Problem("spec.environment.id", str(err), job.spec.environment.id)],
                                   source=job.metadata.name))
        return INVALID_SPEC_EXIT_CODE
    except CheckpointStoreRefused as err:  # no retry passes until the spec or its Secret changes
        _print_problems(InvalidJob([Problem(err.field, str(err), has_value=False)], source=job.metadata.name))
        return INVALID_SPEC_EXIT_CODE
    except (RuntimeError, TimeoutError, ConnectionError) as err:  # a clear line, not a traceback
        print(f"error: {err}", file=sys.stderr)
        # In a pod, the line is the container's termination message too: the pod's Ray node, started
        # beside the learner, may still write to the same log after it (the kubelet's fallback quotes
        # the log's last lines).
        from kuberl.trainer.metrics import write_termination_message

        write_termination_message(f"error: {err}")
        return 1
    code = 0 if result.ok else 1
    if options.exit_after:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _load_sweep(path: str, tenancy=None):
    """A sweep file judged by `parse_sweep`, the operator's judge (with the namespace's `tenancy` where
    `kuberl validate` gives one), its environment built as for a job; None, its problems printed, when it
    cannot run."""
    from kuberl.api.sweep import InvalidSweep, load_sweep_file
    from kuberl.trainer.envs.resolve import check_environment

    try:
        return load_sweep_file(path, check=check_environment, tenancy=tenancy)
    except InvalidSweep as err:
        _print_problems(err)
        return None


def _sweep_ok(sweep) -> int:
    print(f"ok: {sweep.metadata.name}: {len(sweep.spec.parameters)} parameter(s), {sweep.spec.seeds} seed(s) "
          f"per configuration, at most {sweep.spec.max_trials} trials")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from kuberl.sweep.engine import SweepChanged

    if args.parallel is not None and args.parallel < 1:
        print(f"error: --parallel: at least 1 [given: {args.parallel}]", file=sys.stderr)
        return 2
    sweep = _load_sweep(args.sweep)
    if sweep is None:
        return 2
    if args.validate_only:
        return _sweep_ok(sweep)

    from kuberl.trainer.sweep import SweepOptions, run_sweep

    options = SweepOptions(directory=Path(args.dir) if args.dir else None, resume=args.resume,
                           parallel=args.parallel, live=not args.no_progress and sys.stderr.isatty())
    try:
        run_sweep(sweep, options)
    except (FileExistsError, SweepChanged) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: `kuberl sweep {args.sweep} --resume` continues it (finished trials are kept)",
              file=sys.stderr)
        return 130
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from kuberl.trainer.serving.export import ExportError, export

    try:
        out = export(args.run_dir, args.output, args.format)
    except (ExportError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {out} ({args.format})")
    return 0


def _cmd_preferences(args: argparse.Namespace) -> int:
    from kuberl.trainer.preferences import ranking

    run_dir = Path(args.run_dir)
    try:
        pairs = ranking.pairs_path(run_dir, args.pairs_file)
        if (args.pair is None) != (args.prefer is None):
            raise ranking.RankingError("--pair and --prefer go together: --pair ID --prefer a|b|equal")
        if args.pair is not None:
            print(ranking.rank(run_dir, pairs, args.pair, args.prefer))
        else:
            ranking.show(run_dir, pairs, args.limit, interactive=sys.stdin.isatty())
    except ranking.RankingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _serve_flag_problems(args: argparse.Namespace) -> list:
    """`kuberl serve`'s numbers: --max-batch by spec.serving.maxBatch's rule (the operator passes it from
    there); a port outside a pod may be any TCP port (a pod's must be 1024 or more)."""
    from typing import Annotated

    from pydantic import Field, TypeAdapter, ValidationError

    from kuberl.api.job import ServingSpec
    from kuberl.api.load import Problem

    port = TypeAdapter(Annotated[int, Field(ge=1, le=65535)])
    rules = {"--port": port, "--metrics-port": port,
             "--max-batch": TypeAdapter(Annotated[(int, *ServingSpec.model_fields["max_batch"].metadata)])}
    problems = []
    for flag, rule in rules.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        try:
            if value is not None:
                rule.validate_python(value)
        except ValidationError as err:
            problems.append(Problem(flag, err.errors()[0]["msg"], value))
    if args.port == args.metrics_port:
        problems.append(Problem("--metrics-port", "must differ from --port", args.metrics_port))
    return problems


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging

    problems = _serve_flag_problems(args)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2

    # One BLAS thread: the server batches on one event loop, and BLAS threads that spin waiting for
    # work on a busy machine turned batch-64 forward passes from 70 µs into tens of milliseconds.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

    from kuberl.trainer.serving.export import ExportError
    from kuberl.trainer.serving.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(args.path, args.host, args.port, args.model_name, args.max_batch, args.metrics_port)
    except (ExportError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _process_start() -> float | None:
    """time.perf_counter() when this process started (Linux), so a run's time split covers it all."""
    import time

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.perf_counter() - max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def _tenancy_flags(p: argparse.ArgumentParser) -> None:
    """`kuberl validate`'s allowance of the namespace, as the chart's tenancy.namespaces gives it."""
    p.add_argument("--pod-security", default="restricted", choices=["restricted", "baseline", "privileged"],
                   help="the Pod Security level the job's (or sweep's) namespace allows its pods (the operator's "
                        "default: restricted; a platform team may allow more per namespace)")
    p.add_argument("--service-account", action="append", default=[], metavar="NAME",
                   help="a ServiceAccount the namespace allows a template to name (repeat for several; "
                        "default: none)")
    p.add_argument("--identity-key", action="append", default=[], metavar="KEY",
                   help="a cloud-identity label or annotation (or a prefix ending in '/') the namespace allows a "
                        "template to set, as the chart's tenancy.namespaces.<ns>.identityKeys (repeat; default: none)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a job file; print every problem; exit 2 when invalid")
    p.add_argument("job", help="RLTrainingJob (or RLSweep) YAML file")
    _tenancy_flags(p)
    p.add_argument("--server", action="store_true",
                   help="also ask the API server of the current kube context: the job and every object the "
                        "operator would create for it, as server-side dry runs (validation, Pod Security, quota, "
                        "admission webhooks; nothing is created)")
    p.add_argument("--namespace", help="with --server: the namespace to check in (default: the job's, else the "
                                       "context's)")
    p.add_argument("--context", help="with --server: the kube context (default: the current one)")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("crd", help="print the RLTrainingJob (or RLSweep) CustomResourceDefinition generated from "
                       "the model")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--kind", choices=["RLTrainingJob", "RLSweep"], default="RLTrainingJob", help="which resource")
    p.set_defaults(func=_cmd_crd)

    for name, helptext in (
        ("train", "train a job: an embedded Ray here, or an existing cluster with --ray-address"),
        ("learner", "the learner pod's entry point (same as train; reads $KUBERL_JOB_SPEC_FILE when no file)"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("job", nargs="?", default=None, help="RLTrainingJob YAML file ('-' for stdin)")
        p.add_argument("--resume", action="store_true", help="continue from the run directory's newest checkpoint")
        p.add_argument("--run-dir", help="run directory (default runs/<job name>; $KUBERL_RUN_DIR in a pod)")
        p.add_argument("--ray-address", help="join this Ray cluster (host:port) instead of starting one")
        for flag, (path, kind, what) in SPEC_FLAGS.items():
            p.add_argument(flag, type=kind, help=f"{what} (overrides {path})")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.set_defaults(func=_cmd_train)

    p = sub.add_parser("sweep", help="run an RLSweep's trials here (embedded Ray), rank its configurations "
                       "by IQM with bootstrap intervals")
    p.add_argument("sweep", help="RLSweep YAML file")
    p.add_argument("--dir", help="sweep directory (default sweeps/<sweep name>)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in its directory: finished trials "
                   "are kept, interrupted ones run again")
    p.add_argument("--parallel", type=int, help="most trials at once (default: spec.parallelism, within the cores)")
    p.add_argument("--validate-only", action="store_true", help="check the file and exit")
    p.add_argument("--no-progress", action="store_true", help="a log line per trial instead of the live table")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("export", help="write a run's newest loadable checkpoint as a self-contained policy artifact")
    p.add_argument("run_dir", help="run directory (job.yaml + checkpoints/)")
    p.add_argument("--format", choices=["numpy", "onnx", "torchscript"], default="numpy",
                   help="numpy: policy.json + weights.npz (what `kuberl serve` runs); onnx / torchscript add "
                        "policy.onnx / policy.pt (greedy action from the flattened observation) beside them")
    p.add_argument("-o", "--output", help="artifact directory (default RUN_DIR/policy)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("preferences", help="show a run's candidate segment pairs and rank them for the "
                       "BDQ preference head (read while training)")
    p.add_argument("run_dir", help="run directory (its preferences/candidates.jsonl)")
    p.add_argument("--pair", help="candidate pair id to rank")
    p.add_argument("--prefer", choices=["a", "b", "equal"], help="which segment of --pair is better")
    p.add_argument("--limit", type=int, default=3, help="unranked pairs to show, newest first (default 3)")
    p.add_argument("--pairs-file", help="pairs file to append to (default: the job's, or "
                   "RUN_DIR/preferences/pairs.jsonl)")
    p.set_defaults(func=_cmd_preferences)

    p = sub.add_parser("serve", help="serve a policy over HTTP: Open Inference Protocol (KServe v2) and /act")
    p.add_argument("path", help="an exported policy directory, or a run directory (its newest checkpoint)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (protocol, /act and /metrics)")
    p.add_argument("--model-name", help="model name in the protocol's paths (default: the job's name)")
    p.add_argument("--max-batch", type=int, default=256, help="most observations in one forward pass")
    p.add_argument("--metrics-port", type=int, help="also serve /metrics alone on this port")
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.exit_when_done = argv is None  # the real command line, not a caller in this process
    if args.command == "learner":
        args.resume = True  # a restarted learner pod always continues from its volume
        args.run_dir = args.run_dir or os.environ.get("KUBERL_RUN_DIR", "/checkpoints")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
