"""A TCP port in front of a real server that breaks connections on demand: a store or a tracker that is
down, then back, or a request cut off partway, as a network or a killed pod cuts it.

Each new connection takes the next action queued in `actions`, else `always`, else carries it through:
("refuse",) closes it at once (counted in `refused`); ("cut", n) carries the client's first n bytes to the
server, then closes both sides.
"""

from __future__ import annotations

import socket
import threading
from collections import deque


class TcpFaults:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.actions: deque[tuple] = deque()
        self.always: tuple | None = None
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            action = self.actions.popleft() if self.actions else self.always or ("pass",)
            if action[0] == "refuse":
                self.refused += 1
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            budget = action[1] if action[0] == "cut" else None
            threading.Thread(target=self._pump, args=(conn, upstream, budget), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, None), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, budget: int | None) -> None:
        try:
            while data := src.recv(65536):
                if budget is not None:
                    data = data[:budget]
                    budget -= len(data)
                dst.sendall(data)
                if budget == 0:
                    break
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
