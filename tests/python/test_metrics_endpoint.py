"""The /metrics HTTP server under hostile clients (server/metrics_http.h,
docs/metrics.md "Endpoint"): a slow-loris client or hundreds of idle
connections do not delay scrapes; the slow client is cut off at the head
timeout (5 s), idle ones at the idle timeout (2 s); oversized heads get 431;
no descriptor is left behind and SIGTERM with clients connected exits cleanly.
Real server, real sockets; the whole module takes about 15 s.

Time is observed only where it cannot make a test flaky: a scrape is shown
not to wait on a slow client by the order of events (answered while that
client is still connected), and a timeout only by a lower bound (a connection
is not closed before it), which a loaded machine can only lengthen. Upper
bounds are hang guards, a minute or more."""
import itertools
import os
import resource
import select
import socket
import threading
import time

import pytest

from snapserve_testkit.metrics import families, scrape, types

HEAD_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 256
# How long a wait may last before it counts as a hang: far above any real
# delay, so only a server that never does the thing fails on it.
HANG_S = 60.0


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    return start_module_server([f"--model={model_path}", "--kv-cache-memory=16MiB",
                                "--default-kv-method=none"])


def strict_scrape(port):
    """A scrape whose text prometheus_client parses as Prometheus exposition
    text (a bad line raises), with snapserve's request counter in it."""
    text = scrape(port, timeout=HANG_S)
    assert families(text)
    assert types(text).get("snapserve_requests_total") == "counter"
    return text


def exchange(port, request, timeout=5):
    """(status code, headers dict, body) of one raw request."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock):
    """True when the server has closed `sock` (EOF or reset waiting to be read);
    never waits (a socket with a timeout would wait for data in recv, flags or
    not)."""
    readable = select.poll()  # poll: select() refuses descriptors past 1023
    readable.register(sock, select.POLLIN)
    if not readable.poll(0):
        return False
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_slow_loris_does_not_delay_scrapes_and_is_cut_off(server):
    # Taken before connecting: the server's head timeout starts at its accept,
    # later, so the cut comes at least HEAD_TIMEOUT_S after this.
    start = time.monotonic()
    slow = socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5)
    cut_at = []

    def trickle():
        """A head that never ends, one byte every 0.5 s: well under the idle
        timeout, so only the head timeout can end it."""
        for byte in itertools.cycle(b"GET /metrics HTTP/1.1\r\nX-Slow: a\r\n"):
            try:
                slow.send(bytes([byte]))
            except OSError:
                cut_at.append(time.monotonic())
                return
            if select.select([slow], [], [], 0.5)[0]:  # closed: no answer to half a head
                cut_at.append(time.monotonic())
                return
            if time.monotonic() - start > HANG_S:
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    # Scrapes answered while the slow client was still connected: a server
    # that waited on it would answer only once it had cut it off.
    answered_beside_slow = 0
    while sender.is_alive():
        strict_scrape(server.metrics_port)
        if not closed_by_server(slow):
            answered_beside_slow += 1
        time.sleep(0.2)
    sender.join()
    slow.close()
    assert cut_at, "slow client never cut off"
    assert answered_beside_slow >= 1, "no scrape was answered while the slow client was connected"
    # Cut off by the head timeout, not before it.
    assert cut_at[0] - start >= HEAD_TIMEOUT_S - 0.2, cut_at[0] - start


def test_idle_connections_neither_block_scrapes_nor_stay_open(server):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(300, soft - 64)  # 300 exceeds the cap of 256: the oldest are evicted
    idle = [socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5)
            for _ in range(count - 1)]
    # Taken before the last connection: its idle timeout starts later, at the
    # server's accept, so it cannot close before IDLE_TIMEOUT_S after this.
    last_opened = time.monotonic()
    idle.append(socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5))
    try:
        # A server that served connections one at a time would reach these
        # scrapes only after the idle ones timed out, 2 s each: the scrape's
        # own timeout (HANG_S) then fails it.
        for _ in range(7):
            strict_scrape(server.metrics_port)
        if count > MAX_CONNECTIONS:
            deadline = time.monotonic() + HANG_S
            while (sum(closed_by_server(s) for s in idle) < count - MAX_CONNECTIONS
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            assert sum(closed_by_server(s) for s in idle) >= count - MAX_CONNECTIONS
        # Idle connections are closed once the idle timeout passes.
        deadline = time.monotonic() + HANG_S
        while not all(closed_by_server(s) for s in idle) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(closed_by_server(s) for s in idle)
        assert time.monotonic() - last_opened >= IDLE_TIMEOUT_S - 0.2
    finally:
        for s in idle:
            s.close()


def test_oversized_head_gets_431(server):
    pad = b"X-Pad: " + b"a" * 20000 + b"\r\n"
    status, headers, _ = exchange(server.metrics_port,
                                  b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n")
    assert status == 431
    assert headers["Connection"] == "close"
    strict_scrape(server.metrics_port)  # still healthy


def test_http_semantics(server):
    port = server.metrics_port
    status, headers, body = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and int(headers["Content-Length"]) == len(body) > 0
    assert "Date" in headers
    status, headers, body = exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and int(headers["Content-Length"]) > 0 and body == b""
    status, headers, _ = exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, _, _ = exchange(port, b"nonsense\r\n\r\n")
    assert status == 400
    status, _, _ = exchange(port, b"GET /nowhere HTTP/1.1\r\n\r\n")
    assert status == 404


def metrics_port_sockets(pid, port):
    """The process's descriptors that are TCP sockets bound to `port` (the
    listener and its accepted connections). Other subsystems (gRPC's event
    engine, LibTorch's thread pools) may open descriptors of their own at any
    time, so counting every descriptor would measure them too."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    sockets = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed while we listed
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            sockets[fd] = target
    return sockets


def test_no_descriptor_is_left_behind(server):
    def held():
        return metrics_port_sockets(server.pid, server.metrics_port)

    strict_scrape(server.metrics_port)
    # The server closes a scrape's connection after writing the answer, which
    # the client may have read a moment before.
    deadline = time.monotonic() + HANG_S
    while len(held()) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    before = held()
    assert len(before) == 1, f"only the listener should be open, found {before}"
    for _ in range(20):
        strict_scrape(server.metrics_port)
    for _ in range(20):  # connected and closed by the client without a request
        socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5).close()
    deadline = time.monotonic() + HANG_S
    while held() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held() == before


def test_sigterm_with_connections_open_exits_cleanly(server):
    """Last in the module: it stops the shared server. Stop() must not wait on
    a client: idle, half-sent and unread connections are closed, the thread
    joined, and the process exits 0 (SIGKILL after HANG_S would give -9)."""
    port = server.metrics_port
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    partial = socket.create_connection(("127.0.0.1", port), timeout=5)
    partial.sendall(b"GET /metrics HTTP/1.1\r\n")
    unread = socket.create_connection(("127.0.0.1", port), timeout=5)
    unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    unread.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    time.sleep(0.2)
    assert server.stop(timeout=HANG_S) == 0
    for s in (idle, partial, unread):
        s.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
