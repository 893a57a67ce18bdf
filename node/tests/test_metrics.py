"""A real bookie process's /metrics: parses as Prometheus text; its counters equal what was written and read
under load from several streams (entries, bytes, refusals by code, one latency observation per request); its
mode gauge follows a read-only switch; the endpoint answers only GET/HEAD /metrics and /healthz; bad settings
are refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from octavo.node.testing import BookieConnection, BookieProcess
from octavo.v1 import bookie_pb2 as pb

KEY = b"metrics-key"
STREAMS = 4
REQUESTS_PER_STREAM = 30
ENTRIES_PER_REQUEST = 20


def scrape(address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels -> value} for every sample (histogram samples under their own names)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(str(tmp_path_factory.mktemp("metrics") / "bookie"), args=["--metrics-port", "0"])
    proc.start()
    assert proc.metrics_address, "the ready file names the metrics endpoint"
    yield proc
    proc.stop()


def test_counters_match_what_was_written_and_read_under_load(bookie: BookieProcess) -> None:
    before = scrape(bookie.metrics_address)
    sent_bytes = [0] * STREAMS
    errors: list[str] = []

    def writer(stream: int) -> None:
        ledger = 100 + stream
        requests = []
        for r in range(REQUESTS_PER_STREAM):
            ids = list(range(r * ENTRIES_PER_REQUEST, (r + 1) * ENTRIES_PER_REQUEST))
            payloads = [os.urandom(10 + (stream * 31 + e) % 900) for e in ids]
            sent_bytes[stream] += sum(map(len, payloads))
            requests.append(pb.AddRequest(request_id=r + 1, ledgers=[pb.LedgerAdds(
                ledger_id=ledger, master_key=KEY, entry_ids=ids, payloads=payloads, last_add_confirmed=-1)]))
        with BookieConnection(bookie.address) as conn:
            for response in conn.add_requests(requests):
                if response.error or any(any(result.codes) for result in response.results):
                    errors.append(str(response))

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(STREAMS)]
    for t in threads:
        t.start()
    during = scrape(bookie.metrics_address)  # a scrape while the streams write: counters only grow
    for t in threads:
        t.join()
    assert not errors
    with BookieConnection(bookie.address) as conn:
        refused = conn.add(100, b"a-wrong-key", [10_000, 10_001], [b"x", b"y"])  # UNAUTHORIZED, both entries
        assert list(refused.results[0].codes) == [pb.UNAUTHORIZED] * 2
        read = conn.read(101, 0, 49)
        assert not read.error and len(read.entries) == 50
        read_bytes = sum(len(e.payload) for e in read.entries)
        missing = conn.read(999_999, 0, 0)
        assert missing.error == pb.NO_SUCH_LEDGER
    after = scrape(bookie.metrics_address)

    entries = STREAMS * REQUESTS_PER_STREAM * ENTRIES_PER_REQUEST
    requests = STREAMS * REQUESTS_PER_STREAM + 1

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - before.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    assert value(before, "octavo_bookie_add_entries_total") <= value(during, "octavo_bookie_add_entries_total")
    assert grew("octavo_bookie_add_entries_total") == entries
    assert grew("octavo_bookie_add_bytes_total") == sum(sent_bytes)
    assert grew("octavo_bookie_add_requests_total") == requests
    assert grew("octavo_bookie_add_refused_total", code="UNAUTHORIZED") == 2
    assert grew("octavo_bookie_add_latency_seconds_count") == requests
    assert grew("octavo_bookie_add_latency_seconds_sum") > 0
    assert value(after, "octavo_bookie_add_latency_seconds_bucket", le="+Inf") == \
        value(after, "octavo_bookie_add_latency_seconds_count")
    assert grew("octavo_bookie_read_requests_total") == 2
    assert grew("octavo_bookie_read_entries_total") == 50
    assert grew("octavo_bookie_read_bytes_total") == read_bytes
    assert grew("octavo_bookie_read_errors_total", code="NO_SUCH_LEDGER") == 1
    assert value(after, "octavo_bookie_ledgers") == STREAMS
    assert value(after, "octavo_bookie_entry_log_bytes") >= sum(sent_bytes)
    assert value(after, "octavo_bookie_write_cache_entries") <= value(after, "octavo_bookie_write_cache_entries_max")
    assert 0 < value(after, "octavo_bookie_disk_usage_ratio", data_dir=os.path.abspath(bookie.data_dir)) < 1


def test_recovery_point_lag_and_fenced_ledgers_follow_the_storage(bookie: BookieProcess) -> None:
    with BookieConnection(bookie.address) as conn:
        assert not conn.add(500, KEY, [0, 1], [b"a" * 1000, b"b" * 1000]).error
        fenced_before = value(scrape(bookie.metrics_address), "octavo_bookie_fenced_ledgers")
        assert conn.read_lac(500, fence=True, master_key=KEY).code == pb.OK
        samples = scrape(bookie.metrics_address)
        assert value(samples, "octavo_bookie_fenced_ledgers") == fenced_before + 1
        assert value(samples, "octavo_bookie_fences_total") >= 1
        # The unflushed tail holds at least the two entries just written (the fence may roll the log).
        assert value(samples, "octavo_bookie_recovery_point_lag_bytes") + \
            value(samples, "octavo_bookie_flush_logs_total") > 0


def test_a_read_only_switch_shows_on_the_mode_gauge(bookie: BookieProcess) -> None:
    def mode() -> dict[str, float]:
        samples = scrape(bookie.metrics_address)
        return {m: value(samples, "octavo_bookie_mode", mode=m) for m in ("writable", "read_only")}

    assert mode() == {"writable": 1.0, "read_only": 0.0}
    with BookieConnection(bookie.address) as conn:
        conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=True), timeout=30)
        try:
            assert mode() == {"writable": 0.0, "read_only": 1.0}
            refused = conn.add(600, KEY, [0], [b"x"])
            assert list(refused.results[0].codes) == [pb.READ_ONLY]
            assert value(scrape(bookie.metrics_address), "octavo_bookie_add_refused_total", code="READ_ONLY") >= 1
        finally:
            conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=False), timeout=30)
    assert mode() == {"writable": 1.0, "read_only": 0.0}
    with BookieConnection(bookie.address) as conn:
        assert conn.status().metrics_address == bookie.metrics_address


def test_the_endpoint_answers_only_get_and_head_on_metrics(bookie: BookieProcess) -> None:
    base = f"http://{bookie.metrics_address}"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}/other", timeout=10)
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", data=b"x", method="POST"), timeout=10)
    assert e.value.code == 405
    with urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", method="HEAD"), timeout=10) as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) > 0 and r.read() == b""
    # /healthz answers what the gRPC health service does (Kubernetes probes it when the gRPC port needs TLS).
    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as r:
        assert r.status == 200 and r.read() == b"serving\n"
    # A client that sends garbage and hangs up does not stop the endpoint.
    host, port = bookie.metrics_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert "octavo_bookie_mode" in scrape(bookie.metrics_address)


def test_bad_metrics_settings_are_refused_with_a_message(tmp_path: pytest.TempPathFactory) -> None:
    def node(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(tmp_path),
                               *args], capture_output=True, text=True, timeout=60)

    bad_port = node("--metrics-port", "-5")
    assert bad_port.returncode == 2 and "metrics_port must be in [-1, 65535]" in bad_port.stderr
    bad_ratio = node("--trace-sample-ratio", "1.5")
    assert bad_ratio.returncode == 2 and "trace_sample_ratio must be in [0, 1]" in bad_ratio.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        in_use = node("--port", "0", "--metrics-port", str(taken.getsockname()[1]))
    assert in_use.returncode == 1 and "cannot serve metrics on 127.0.0.1" in in_use.stderr, in_use.stderr


def test_a_bookie_pushes_metrics_and_spans_over_otlp(tmp_path: pytest.TempPathFactory) -> None:
    """otlp_endpoint: the bookie pushes its metrics and exports its sampled spans to a collector (a real OTLP
    gRPC receiver here); a graceful stop flushes both."""
    from octavo.telemetry.testing import OtlpReceiver

    with OtlpReceiver() as receiver:
        proc = BookieProcess(str(tmp_path / "otlp"), args=["--otlp-endpoint", receiver.endpoint,
                                                           "--trace-sample-ratio", "1"])
        proc.start()
        try:
            with BookieConnection(proc.address) as conn:
                for r in range(5):
                    ids = list(range(r * 10, r * 10 + 10))
                    assert not conn.add(7, KEY, ids, [b"p" * 100] * 10).results[0].message
        finally:
            assert proc.stop() == 0
        assert receiver.total("octavo.bookie.add.entries") == 50
        assert receiver.total("octavo.bookie.add.bytes") == 5000
        assert receiver.histogram_count("octavo.bookie.add.latency") == 5
        adds = [s for s in receiver.spans() if s[0] == "octavo.bookie.add"]
        assert len(adds) == 5 and all(a[2]["octavo.entries"] == 10 for a in adds)
