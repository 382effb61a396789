"""The suite's own scheduler (tests/conftest.py, `pytest -n`): whole modules per worker, one end-to-end bed
while other tests are queued, a second once only beds are left, never a third (nor more than a machine's
real node slots).
Driven the way xdist drives it (collection, schedule, a report per finished test), with workers that record
what they are sent."""

from __future__ import annotations

from types import SimpleNamespace

import conftest
from bed.real_node_config import NODE_SLOTS

#: Beds (fictional modules beside the cluster one): the rules on how many beds at once.
MODULES = {
    "tests/e2e/test_e2e_cluster.py": 3, "tests/e2e/test_bed_two.py": 2, "tests/e2e/test_bed_three.py": 1,
    "tests/e2e/test_bed_four.py": 2,
    "tests/integration/test_a.py": 4, "tests/unit/test_b.py": 4,
}
COLLECTION = [f"{module}::test_{i}" for module, n in MODULES.items() for i in range(n)]


class Worker:
    def __init__(self, name: str):
        self.name = name
        self.sent: list[int] = []
        self.shutting_down = False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


def scheduler(workers: list[Worker], collection: list[str] = COLLECTION):
    config = SimpleNamespace(getvalue=lambda name: [f"{len(workers)}*popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=False))
    sched = conftest.pytest_xdist_make_scheduler(config, None)
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, collection)
    sched.schedule()
    return sched


def running_beds(sched) -> dict[str, list[str]]:
    return {str(w): [scope for scope, done in units.items()
                     if conftest.is_end_to_end(scope) and not all(done.values())]
            for w, units in sched.assigned_work.items()}


def finish_module(sched, worker: Worker, module: str, collection: list[str] = COLLECTION) -> None:
    for nodeid in [n for n in collection if n.startswith(module + "::")]:
        if not sched.assigned_work[worker][module][nodeid]:
            sched.mark_test_complete(worker, collection.index(nodeid))


def bed_workers(sched) -> set[str]:
    return {worker for worker, beds in running_beds(sched).items() if beds}


def test_one_bed_while_other_tests_are_queued_then_a_second_and_never_a_third():
    a, b, c = workers = [Worker("a"), Worker("b"), Worker("c")]
    sched = scheduler(workers)
    # The first worker takes the longest bed; the others skip the queued beds for the other layers.
    assert running_beds(sched) == {"a": ["tests/e2e/test_e2e_cluster.py"], "b": [], "c": []}, sched.assigned_work
    assert set(sched.assigned_work[b]) | set(sched.assigned_work[c]) == {"tests/integration/test_a.py",
                                                                         "tests/unit/test_b.py"}
    # b's module ends while c's runs: only beds are queued and one runs, so b takes the rest of them (a
    # worker is sent its next module before its last test ends, so it holds them one after another).
    finish_module(sched, b, "tests/integration/test_a.py")
    assert running_beds(sched)["b"] == ["tests/e2e/test_bed_two.py", "tests/e2e/test_bed_three.py"]
    assert bed_workers(sched) == {"a", "b"} and list(sched.workqueue) == ["tests/e2e/test_bed_four.py"]
    # Two workers hold beds: c, done with its module, gets no third bed and stops.
    finish_module(sched, c, "tests/unit/test_b.py")
    assert c.shutting_down and bed_workers(sched) == {"a", "b"}
    assert list(sched.workqueue) == ["tests/e2e/test_bed_four.py"]
    # The cluster bed ends: a takes the bed still queued, beside b's.
    finish_module(sched, a, "tests/e2e/test_e2e_cluster.py")
    assert running_beds(sched)["a"] == ["tests/e2e/test_bed_four.py"] and not sched.workqueue
    sent_to_b = [COLLECTION[i] for i in b.sent]
    assert [n for n in sent_to_b if "e2e" in n] == [n for n in COLLECTION if "bed_two" in n or "bed_three" in n]


def test_beds_wait_while_other_tests_are_queued():
    """While a module of another layer is queued, a worker never starts a second bed beside the first."""
    workers = [Worker("a"), Worker("b")]
    sched = scheduler(workers)
    assert bed_workers(sched) == {"a"}
    finish_module(sched, workers[1], "tests/integration/test_a.py")
    # tests/unit/test_b.py was still queued: b took it, not a bed.
    assert "tests/unit/test_b.py" in sched.assigned_work[workers[1]] and bed_workers(sched) == {"a"}


def test_no_bed_waits_for_a_real_node_slot():
    """Every bed may be a real node, and a machine runs NODE_SLOTS of them at once: the scheduler never
    starts more beds than that, so no worker sits waiting for a slot while tests are queued."""
    assert max(conftest.BEDS_AT_ONCE, conftest.BEDS_WHEN_ONLY_BEDS_LEFT) <= NODE_SLOTS
