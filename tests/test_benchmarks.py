"""The benchmark scripts stay runnable: each imports against the package as it is now
(running them takes minutes, so the tests only load them)."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time

import pytest

from conftest import REPO

SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))


def load(script, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # imports only: main() runs under __main__
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_script_loads(script, monkeypatch):
    assert callable(load(script, monkeypatch).main)


def test_paced_server_dates_a_request_when_the_kernel_received_it(monkeypatch):
    """The fidelity benchmark's truth: a request read late is dated when it arrived."""
    fidelity = load(REPO / "benchmarks/paced_server.py", monkeypatch)
    with fidelity.listening_socket(0, reuse_port=True) as listener:
        listener.setblocking(True)  # this test reads synchronously
        with socket.create_connection(listener.getsockname()) as client:
            conn, _ = listener.accept()
            with conn:
                # Linux turns receive stamping on host-wide a moment after the first socket asks
                # for it (a deferred static key), and TCP gives no stamp for a segment received
                # before: exchange until one comes back stamped, as the server's warm traffic is
                deadline = time.monotonic() + 5
                while True:
                    client.sendall(b"x")
                    _, warm, _, _ = conn.recvmsg(16, socket.CMSG_SPACE(16))
                    if fidelity.kernel_arrival_ns(warm) is not None:
                        break
                    assert time.monotonic() < deadline, "the kernel never stamped a received segment"
                    time.sleep(0.01)
                sent = time.perf_counter_ns()
                client.sendall(b"GET / HTTP/1.1\r\n\r\n")
                time.sleep(0.05)  # the server's loop is busy elsewhere
                _, ancdata, _, _ = conn.recvmsg(1024, socket.CMSG_SPACE(16))
                read = time.perf_counter_ns()
                arrival = fidelity.kernel_arrival_ns(ancdata)
    assert arrival is not None
    assert sent <= arrival < sent + 10_000_000 and read - arrival >= 50_000_000
