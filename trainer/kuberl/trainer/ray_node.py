"""`python -m kuberl.trainer.ray_node <ray start arguments>`: Ray's own `ray start`, with the node's agents
in Ray's minimal mode and a start that failed tried again. Every Ray node of a job's pods (the head, the
rollout workers, the learners) starts through it.

Why: a raylet waits 15 s, fixed in Ray's C++ and not configurable, for its dashboard agent to write its
port files, then aborts (`Timed out waiting for file .../metrics_agent_port_...`). The full agent imports
the dashboard's modules first, several seconds of CPU; on a busy node (three jobs' heads starting beside
other work on two cores) it missed the 15 s, the head's raylet aborted, and `ray start` noticed only
minutes later, when one call to the GCS for the node ran out; the head pod failed and the job spent a
backoffLimit restart. So:
- the agents run in minimal mode (what Ray runs where `ray[default]`'s extras are not installed): they
  write their ports after far fewer imports. What the job loses is Ray's dashboard and Ray's own node
  metrics, which KubeRL does not use (the learner exports the job's metrics itself). Ray has no switch for
  this: the check Ray makes for those extras is answered "missing" in this process, which builds the
  agents' command lines;
- the agents' port files are written before the raylet starts (`ports_known_first`): under more load (a
  test suite, load 15-20 on two cores) even the minimal agents missed the 15 s, every start of a node;
  and the dashboard agent, which in minimal mode does nothing else, is not started at all
  (`without_dashboard_agent`: a process that stays up with its raylet stands in);
- a head asked for no dashboard starts no dashboard API server either (Ray starts one regardless), and
  the operator's heads start no autoscaler monitor (`--no-monitor`: the operator sizes the cluster);
- the node's registration is polled in the GCS's node table, and a node not there after `REGISTER_S` is a
  failed start (`polling_get_node`), instead of one call that waited minutes;
- a failed start (the node never came up: Ray raised while starting it) is cleaned up (every process
  this one started, and theirs: never `ray stop`, which kills every Ray process of the host, other
  nodes' and other jobs' too wherever nodes share a host) and tried again, `ATTEMPTS` times in all,
  before the container fails. A failure
  after the node is up (`--block` seeing a Ray process exit) ends the container at once, as before.
A node that joins a head (`--wait-for=HOST:PORT`, KubeRL's own option, given once per port) first waits
until each of those ports accepts a connection: a worker or learner pod starts beside its head, and a
`ray start` against a head whose GCS answers but whose own node has not registered gives up on it (on a busy
node the head's GCS answered for minutes before its raylet was up, and workers looped through failed starts
that took the CPU the head needed). A socket probe every half second, in this process: no init container
that starts the whole image only to poll.
Nothing here imports torch: a worker or head pod never needs it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

MINIMAL_REASON = "kuberl: Ray's agents run in minimal mode (kuberl.trainer.ray_node)"
#: Starts of the node tried in one container before it fails (and the operator's restart rules apply).
ATTEMPTS = 3
#: How long a live raylet may take to appear in the GCS's node table before its start counts as failed (a
#: raylet that exited is a failed start at once, `raylet_exited`). Five minutes, the wait a pod's Ray node gets
#: (RAY_raylet_start_wait_time_s in the operator's builders): on a loaded machine (a test suite, load 15-20 on
#: two cores) an embedded raylet missed Ray's own 30 s, and a node given up on is started again, its new start
#: adding to the load that slowed it.
REGISTER_S = 300.0
#: KubeRL's own option: wait for HOST:PORT to accept a connection before starting the node.
WAIT_FOR = "--wait-for="
#: How often a waiting node says what it waits for (it probes every half second).
WAIT_REPORT_S = 30.0


class NodeStartFailed(Exception):
    """Ray raised while starting this node's processes: nothing of the node is serving yet."""


def minimal_agents() -> ImportError:
    """What `ray._private.utils.get_dashboard_dependency_error` answers under KubeRL: the extras are
    missing, so Ray starts its agents minimal and no dashboard."""
    return ImportError(MINIMAL_REASON)


def raylet_exited() -> bool:
    """Whether this process started a raylet and none of them still runs: a raylet that aborted (a port
    taken, its agents too slow) never registers, and waiting out `REGISTER_S` for it is a minute lost."""
    import psutil  # Ray's own copy (its thirdparty_files, on the path once ray is imported)

    raylets = []
    for child in psutil.Process().children():
        try:
            if child.name() == "raylet":
                raylets.append(child.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            raylets.append(False)
    return bool(raylets) and not any(raylets)


def polling_get_node(get_node: Callable[[str, str], Any], gcs_options: Callable[[str], Any],
                     wait_s: float = 30.0, fail: bool = False,
                     exited: Callable[[], bool] = raylet_exited) -> Callable[[str, str], Any]:
    """Ray's get_node, called once the node is in the GCS's node table (asked every 20 ms, `wait_s` at
    most, and no longer once `exited` says the node's raylet is gone): Ray's own call waits in one-second
    steps, and on a busy GCS one call waited minutes. With `fail`, a node not in the table by then raises
    RuntimeError (what Ray's start loop takes as "not registered yet", and gives up on after its own 30 s)
    instead of asking Ray's call."""
    from ray._private.state import GlobalState

    def polling(gcs_address: str, node_id: str) -> Any:
        state = GlobalState()
        found = gone = False
        try:
            state._initialize_global_state(gcs_options(gcs_address))
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not found and not gone:
                found = any(n.get("NodeID") == node_id for n in state.node_table())
                gone = not found and exited()
                if not found and not gone:
                    time.sleep(0.02)
        except Exception as err:  # noqa: BLE001 - Ray's own call below decides; this only saves time
            log.debug("node table poll failed (%s); leaving it to ray", err)
            found = True
        finally:
            try:
                state.disconnect()
            except Exception as err:  # noqa: BLE001 - nothing to release
                log.debug("node table poll: disconnect failed (%s)", err)
        if fail and gone:
            # Not a RuntimeError: Ray's start loop would take that as "not yet" and ask again for 30 s.
            raise NodeStartFailed(f"node {node_id}: its raylet exited before it registered (its raylet.out says why)")
        if fail and not found:
            raise RuntimeError(f"node {node_id} not registered with the GCS after {wait_s:.0f} s")
        return get_node(gcs_address, node_id)

    return polling


#: A raylet.out line logged at Ray's fatal level ("C", spdlog's critical: RAY_LOG(FATAL), a failed RAY_CHECK).
_FATAL_LINE = re.compile(r"^\[\S+ \S+ C \d+ \d+\] ")


def raylet_says(logs_dir: str | None, lines: int = 8, limit: int = 4096, scan: int = 65536) -> str:
    """Why the node's raylet aborted, to go into the failure's message (the session directory may be gone by
    the time anyone looks: a pod's, a test's temporary one): its last fatal line, found in the last `scan`
    bytes of raylet.out (after it come only a stack trace's lines), then the file's last `lines` lines; at
    most `limit` characters."""
    if not logs_dir:
        return ""
    try:
        with open(os.path.join(logs_dir, "raylet.out"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - scan))
            text = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    fatal = [line for line in text if _FATAL_LINE.match(line)][-1:]
    tail = [line for line in text[-lines:] if line not in fatal]
    if not tail and not fatal:
        return ""
    head = ("; raylet.out's fatal line:\n  " + fatal[0][:limit // 2] + "\n" if fatal else "; ") + "raylet.out ends:\n  "
    return head + "\n  ".join(tail)[-(limit - len(head)):]


def free_port() -> int:
    """A TCP port nothing on this host listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def ports_known_first(start_raylet: Callable[..., Any]) -> Callable[..., Any]:
    """Ray's Node.start_raylet, with the node's agent port files written before the raylet starts.

    Why: the raylet waits 15 s, fixed in its C++, for each agent to write the file that names its port, and
    aborts when one is late: on a loaded machine (load 15-20 on two cores) even a minimal agent's imports
    took longer, and every start of a node failed the same way. The ports need no agent to be known:
    - in minimal mode (what every KubeRL node runs) the dashboard agent writes -1 for its metrics, metrics
      export and HTTP ports (none of them runs), so those files say -1 from the start;
    - the runtime env agent listens on the port the node gives it: a free one is picked here, where Ray
      would let the agent bind any and report it. The raylet's client then waits for that agent to answer
      up to `RAY_agent_register_timeout_ms`, a setting (given `REGISTER_S` here where unset), not the 15 s.
    The agents still write their files as before, with the same values (Ray writes them by rename)."""
    from ray._raylet import (
        DASHBOARD_AGENT_LISTEN_PORT_NAME,
        METRICS_AGENT_PORT_NAME,
        METRICS_EXPORT_PORT_NAME,
        RUNTIME_ENV_AGENT_PORT_NAME,
        persist_port,
    )

    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = self._ray_params
        if not params.runtime_env_agent_port:
            params.runtime_env_agent_port = free_port()
        os.environ.setdefault("RAY_agent_register_timeout_ms", str(int(REGISTER_S * 1000)))
        for name, port in ((METRICS_AGENT_PORT_NAME, -1), (METRICS_EXPORT_PORT_NAME, -1),
                           (DASHBOARD_AGENT_LISTEN_PORT_NAME, -1),
                           (RUNTIME_ENV_AGENT_PORT_NAME, params.runtime_env_agent_port)):
            persist_port(self._session_dir, self._node_id, name, port)
        return start_raylet(self, *args, **kwargs)

    return start


#: What the raylet starts in place of Ray's dashboard agent (`without_dashboard_agent`): a process that lives
#: while its parent, the raylet, does (the raylet fate-shares with its agents) and does nothing else. The
#: raylet gives its agents its pid (RAY_RAYLET_PID, what Ray's own agents watch): a raylet gone before the
#: stand-in looked leaves it reparented, so it exits at once. No imports beyond Python's own (-S: not even
#: site), so it starts in milliseconds.
AGENT_STAND_IN = ("import os, time\nraylet = int(os.environ.get('RAY_RAYLET_PID') or os.getppid())\n"
                  "while os.getppid() == raylet:\n    time.sleep(1)\n")


def without_dashboard_agent(start_ray_process: Callable[..., Any]) -> Callable[..., Any]:
    """Ray's services.start_ray_process, giving a raylet `AGENT_STAND_IN` as its dashboard agent's command.

    Why: in minimal mode (every KubeRL node) the dashboard agent loads no module and serves nothing (no HTTP,
    gRPC or metrics server): it writes its port files, -1 each (written before the raylet starts, by
    `ports_known_first`), and watches its raylet. Yet it imports Ray, connects to the GCS and checks its
    parent every 0.4 s: 2.6 s of CPU per node in the test suite (process accounting, 18 agents) and about
    100 MB, on every pod. The runtime env agent, which does serve the raylet, is Ray's own."""
    import subprocess

    from ray._private import ray_constants

    flag = "--dashboard_agent_command="
    stand_in = flag + subprocess.list2cmdline([sys.executable, "-S", "-c", AGENT_STAND_IN])

    def start(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = [stand_in if arg.startswith(flag) else arg for arg in command]
        return start_ray_process(command, process_type, *args, **kwargs)

    return start


def lean_node_patches() -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for what every KubeRL Ray node starts with, a pod's (`_patch_ray`) and the
    embedded one (kuberl.trainer.workers): minimal agents, their port files first, no dashboard agent. A part
    missing from this Ray is left out."""
    from ray._private import node as ray_node
    from ray._private import services
    from ray._private import utils as ray_utils

    wanted = [(ray_utils, "get_dashboard_dependency_error", lambda _: minimal_agents),
              (ray_node.Node, "start_raylet", ports_known_first),
              (services, "start_ray_process", without_dashboard_agent)]
    return [(owner, name, wrap(getattr(owner, name))) for owner, name, wrap in wanted if hasattr(owner, name)]


def _patch_ray() -> None:
    from ray._private import node as ray_node
    from ray._private import services

    for owner, name, replacement in lean_node_patches():
        setattr(owner, name, replacement)
    services.get_node = polling_get_node(services.get_node, services._get_gcs_client_options,
                                         wait_s=REGISTER_S, fail=True)
    start_api_server = ray_node.Node.start_api_server

    def api_server_with_the_dashboard(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A head started with --include-dashboard=false still starts the dashboard's API server process
        # (Ray's state and job-submission APIs), seconds of CPU on every head: no KubeRL part calls it.
        if self._ray_params.include_dashboard is False:
            return None
        return start_api_server(self, *args, **kwargs)

    ray_node.Node.start_api_server = api_server_with_the_dashboard
    start_node = ray_node.Node.__init__

    def node_init(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            start_node(self, *args, **kwargs)
        except Exception as err:
            raise NodeStartFailed(f"{err}{raylet_says(getattr(self, '_logs_dir', None))}") from err

    ray_node.Node.__init__ = node_init


def stop_own_processes(timeout_s: float = 10.0) -> int:
    """Kill every process this one started, and theirs (the raylet's agents and workers), and reap them:
    what a failed start left behind. Returns how many there were."""
    import psutil  # Ray's own copy (its thirdparty_files, on the path once ray is imported)

    # The whole tree first: a child killed before its own children are listed would leave them orphaned,
    # out of reach of this process.
    tree = psutil.Process().children(recursive=True)
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=timeout_s)
    return len(tree)


def host_and_port(address: str) -> tuple[str, int] | None:
    """A GCS address `HOST:PORT` as (host, port); None for anything else (`auto`, Ray Client's `ray://`)."""
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() and "://" not in host else None


def split_wait_for(args: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """(the `--wait-for=HOST:PORT` addresses, in order; the rest, for `ray start`)."""
    waits, rest = [], []
    for arg in args:
        if arg.startswith(WAIT_FOR):
            where = host_and_port(arg[len(WAIT_FOR):])
            if where is None:
                raise SystemExit(f"kuberl: {arg!r}: expected {WAIT_FOR}HOST:PORT")
            waits.append(where)
        else:
            rest.append(arg)
    return waits, rest


def wait_for(addresses: list[tuple[str, int]], interval_s: float = 0.5,
             report: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Return once each address, in turn, accepts a TCP connection; say what it waits for now and then."""
    for host, port in addresses:
        reported = None
        while True:
            try:
                socket.create_connection((host, port), timeout=2).close()
                break
            except OSError as err:
                if reported is None or time.monotonic() - reported >= WAIT_REPORT_S:
                    report(f"kuberl: waiting for the Ray head at {host}:{port} ({err})")
                    reported = time.monotonic()
                time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    waits, args = split_wait_for(sys.argv[1:] if argv is None else argv)
    wait_for(waits)
    from ray.scripts import scripts  # after the wait: a second of imports a waiting pod need not hold

    _patch_ray()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            scripts.cli.main(args=["start", *args], standalone_mode=False)
            return 0
        except NodeStartFailed as err:
            print(f"kuberl: the Ray node failed to start (attempt {attempt} of {ATTEMPTS}): {err}",
                  file=sys.stderr, flush=True)
            stop_own_processes()
    return 1


if __name__ == "__main__":
    sys.exit(main())
