"""The benchmark scripts stay runnable: each imports against the package as it is now
(running them takes minutes, so the tests only load them)."""

from __future__ import annotations

import importlib.util
import socket
import struct
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


def test_a_stamp_converts_to_the_monotonic_clock_also_when_the_reader_is_preempted(monkeypatch):
    """The conversion reads both clocks; a process preempted between the two reads (5 ms here,
    as on a loaded machine) must not move the arrival by the time it waited."""
    paced = load(REPO / "benchmarks/paced_server.py", monkeypatch)
    read_monotonic = time.perf_counter_ns
    waited = []

    def preempted_after_reading() -> int:
        value = read_monotonic()
        if not waited:
            waited.append(True)
            time.sleep(0.005)
        return value

    stamp_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
    expected = read_monotonic()
    monkeypatch.setattr(time, "perf_counter_ns", preempted_after_reading)
    stamp = struct.pack("qq", *divmod(stamp_ns, 1_000_000_000))
    arrival = paced.kernel_arrival_ns([(socket.SOL_SOCKET, paced.SO_TIMESTAMPNS, stamp)])
    assert waited and abs(arrival - expected) < 1_000_000, (arrival - expected) / 1e6


def test_paced_server_speaks_enough_http_and_vllm_for_peer_clients(monkeypatch):
    """Kept-alive connections, a chunked request body, /tokenize and /detokenize that invert
    each other, and a completions stream in chunks whose last token carries the finish reason."""
    import http.client
    import json

    paced = load(REPO / "benchmarks/paced_server.py", monkeypatch)
    body = b"4\r\nabcd\r\n2;x=y\r\nef\r\n0\r\n\r\n"
    assert paced.chunked_body(body + b"NEXT") == (b"abcdef", len(body))  # the next request stays
    assert paced.chunked_body(b"4\r\nabcd\r\n0\r\n") is None  # the last chunk's blank line is missing
    with paced.PacedServer(ttft_ms=5, gap_ms=1, tokens=4, processes=1) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/v1/models")
        assert json.loads(conn.getresponse().read())["data"][0]["root"] == "paced"
        body = json.dumps({"model": "paced", "prompt": "héllo", "add_special_tokens": False}).encode()
        conn.request("POST", "/tokenize", body=iter([body[:9], body[9:]]), encode_chunked=True)
        tokens = json.loads(conn.getresponse().read())["tokens"]  # same connection, chunked body
        conn.request("POST", "/detokenize", body=json.dumps({"tokens": tokens}))
        assert json.loads(conn.getresponse().read())["prompt"] == "héllo"
        stream = {"prompt": "[bench-7] x", "max_tokens": 3, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(stream))
        response = conn.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
        conn.request("GET", "/health")  # the connection is still usable after a stream
        assert conn.getresponse().status == 200
        (logged,) = server.take_log()
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "length"]
    assert chunks[3]["usage"]["completion_tokens"] == 3 and events[-1] == "[DONE]"
    assert logged["prompt"].startswith("[bench-7]") and logged["tokens"] == 3 and logged["stamped"]
