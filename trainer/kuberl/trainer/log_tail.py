"""The learner's last log lines, kept in memory to go where the run's record goes once the pods (and their
logs) are gone: the tracker's `learner.log` artifact, the object store's `logs/`."""

from __future__ import annotations

import collections
import logging

#: Lines kept: a run's start-up, its last iterations and how it ended.
LOG_TAIL_LINES = 500


class LogTail(logging.Handler):
    """The last LOG_TAIL_LINES records of KubeRL's loggers, formatted as the console shows them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._level_set = False

    def attach(self) -> LogTail:
        kuberl_log = logging.getLogger("kuberl")
        kuberl_log.addHandler(self)
        # The tail keeps INFO lines where nothing set KubeRL's level and the root logger is at Python's
        # default (WARNING: a host process that never configured logging); a level someone set (a sweep's
        # trial keeps its console to warnings) stays theirs.
        self._level_set = kuberl_log.level == logging.NOTSET and kuberl_log.getEffectiveLevel() > logging.INFO
        if self._level_set:
            kuberl_log.setLevel(logging.INFO)
        return self

    def detach(self) -> None:
        kuberl_log = logging.getLogger("kuberl")
        kuberl_log.removeHandler(self)
        if self._level_set:
            kuberl_log.setLevel(logging.NOTSET)
            self._level_set = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 (a record that does not format is not worth a failed run)
            self.handleError(record)

    def text(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode(errors="replace")
