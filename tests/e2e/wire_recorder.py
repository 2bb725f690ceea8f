"""A loopback TCP proxy that records the (api key, version) of every request
a client sends to a broker, and which side closed each connection.

Start the broker with `--advertised-listener` set to the proxy's address, so
that every connection a client opens after bootstrap (Metadata names the
advertised address) goes through the proxy too.
"""

from __future__ import annotations

import socket
import struct
import threading


class WireRecorder:
    def __init__(self, host: str = "127.0.0.1"):
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.addr: tuple[str, int] = self._listener.getsockname()
        self.upstream: tuple[str, int] | None = None
        self._lock = threading.Lock()
        # (api key, version) -> count
        self.requests: dict[tuple[int, int], int] = {}
        # connections the broker closed while the client still had it open
        self.closed_by_broker = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def bootstrap(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def seen(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self.requests)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.closed_by_broker = 0

    def close(self) -> None:
        self._stop.set()
        for s in list(self._socks):
            try:
                s.close()
            except OSError:
                pass
        self._listener.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> "WireRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            assert self.upstream is not None, "set .upstream before clients connect"
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            self._socks += [client, server]
            state = {"client_done": False}
            for target in (self._client_to_server, self._server_to_client):
                t = threading.Thread(target=target, args=(client, server, state), daemon=True)
                t.start()
                self._threads.append(t)

    def _client_to_server(self, client: socket.socket, server: socket.socket,
                          state: dict) -> None:
        buf = b""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                # Record every complete request header in the stream.
                while len(buf) >= 8:
                    (size,) = struct.unpack(">i", buf[:4])
                    if len(buf) < 4 + size:
                        break
                    key, version = struct.unpack(">hh", buf[4:8])
                    with self._lock:
                        self.requests[(key, version)] = self.requests.get((key, version), 0) + 1
                    server.sendall(buf[:4 + size])
                    buf = buf[4 + size:]
        except OSError:
            pass
        finally:
            state["client_done"] = True
            for s in (server, client):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _server_to_client(self, client: socket.socket, server: socket.socket,
                          state: dict) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    if not state["client_done"]:
                        with self._lock:  # the broker closed first
                            self.closed_by_broker += 1
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
