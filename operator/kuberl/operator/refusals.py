"""What the API server refused of a job's creates, as an input of the planner (`lifecycle.plan`), which alone
decides what a refusal means for the job:

- a 403 of the namespace's (a ResourceQuota, a LimitRange): the job keeps what it has and waits, the
  `CreateForbidden` condition says why, and the tries back off until the server takes them;
- a refusal of what a started job's change needs (a scale-up's or a restart's pods under a spec the server
  now refuses: a 422, or Pod Security admission's 403): its running pods are worth more than failing it, so
  it keeps them and `ChangeRefused` says why;
- such a refusal before the job has started: the spec is at fault, and the job fails as InvalidSpec in the
  server's words, with nothing of it written.

The job's loop keeps the refusal between passes (`after`), as it keeps the pods it deleted, and asks the
planner again in the pass that learned of it, so the status it writes already says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kuberl.api.job import Phase, RLTrainingJobStatus
from kuberl.api.problems import Problem
from kuberl.operator import status as job_status

#: The job's condition while the API server refuses its creates as forbidden; False once they go through.
CREATE_FORBIDDEN = "CreateForbidden"
#: A started job's condition while the API server refuses what a change needs; False once the creates go
#: through.
CHANGE_REFUSED = "ChangeRefused"
HELD = (CREATE_FORBIDDEN, CHANGE_REFUSED)
#: Phases of a job that has not created pods yet (or whose pods are gone with its failure).
NOT_STARTED = (Phase.PENDING, Phase.FAILED)


@dataclass(frozen=True)
class Refusal:
    """The API server's last refusal of a job's creates."""

    #: A 403 of the namespace's (quota, LimitRange); False: the object is invalid (422, Pod Security's 403).
    forbidden: bool
    #: The server's words, naming the object.
    message: str
    #: Passes in a row refused, and seconds until the next try.
    tries: int
    retry_s: float
    #: The job's generation it was refused under: a new spec starts over.
    generation: int | None


def after(previous: Refusal | None, *, forbidden: str | None, invalid: str | None, clean: bool, created: bool,
          generation: int | None, retry: Callable[[int], float]) -> Refusal | None:
    """The refusal a pass leaves: this pass's, counted on from the last of its kind; none once the creates
    went through (`clean` and something `created`) or the spec changed; else the last one still."""
    message = forbidden if forbidden is not None else invalid
    if message is not None:
        is_forbidden = forbidden is not None
        same = previous is not None and previous.forbidden == is_forbidden and previous.generation == generation
        tries = previous.tries + 1 if same and previous is not None else 1
        return Refusal(is_forbidden, message, tries, retry(tries), generation)
    if previous is not None and clean and (created or previous.generation != generation):
        return None
    return previous


def current(refusal: Refusal | None, generation: int | None) -> Refusal | None:
    """The refusal, if it is about the spec the job has now."""
    return refusal if refusal is not None and refusal.generation == generation else None


def as_problem(refusal: Refusal | None, before: Phase) -> Problem | None:
    """An invalid child of a job that has not started: the spec's fault, told in the server's words."""
    if refusal is None or refusal.forbidden or before not in NOT_STARTED:
        return None
    return Problem("spec", f"the API server refused a child of this job: {refusal.message}", has_value=False)


def hold(status: RLTrainingJobStatus, refusal: Refusal | None, before: Phase, *, generation: int | None,
         now: datetime) -> str | None:
    """The held-creates conditions from the refusal: True with the reason and the next try while it holds, False
    ("Created") once it is gone. Returns the message of a refusal newly held (for a Warning Event)."""
    held = None
    if refusal is not None and refusal.forbidden:
        held = (CREATE_FORBIDDEN, "Forbidden", refusal.message)
    elif refusal is not None and before not in NOT_STARTED:
        held = (CHANGE_REFUSED, "Invalid", f"{refusal.message}; the job keeps the pods it has: fix the spec and "
                                           "apply it again")
    if refusal is None or held is None:
        for type_ in HELD:
            if job_status.is_true(status, type_):
                job_status.set_condition(status, type_, False, "Created", "", at=now, generation=generation)
        return None
    type_, reason, message = held
    newly = not job_status.is_true(status, type_)
    job_status.set_condition(status, type_, True, reason,
                             f"{message} (try {refusal.tries}; next in {refusal.retry_s:.1f} s)",
                             at=now, generation=generation)
    return message if newly else None
