"""uvicorn, told about the engine loop: on SIGINT / SIGTERM the loop stops first, so every request in flight
ends at once with an error (a stream gets an error event and [DONE]) instead of the shutdown waiting for it."""
from __future__ import annotations

import socket

import uvicorn

from .engine_loop import EngineLoop


class Server(uvicorn.Server):
    def __init__(self, app, loop: EngineLoop, **config):
        super().__init__(uvicorn.Config(app, **config))
        self.engine_loop = loop

    def handle_exit(self, sig, frame) -> None:
        self.engine_loop.stop(timeout=0)          # fail what is in flight now; the thread ends on its own
        super().handle_exit(sig, frame)


def loopback_socket(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """A bound socket (port 0: any free one; read it back with getsockname())."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
