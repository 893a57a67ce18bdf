"""Traces and client metrics end to end, on a real etcd and real bookies (BookieServer, in this process so their
spans can be read from an in-memory exporter): a sampled client append reaches every bookie's add span under
the same trace id, as children of the append's span; a recovery open's fences and a read's bookie reads join
their operation's trace; with sampling off (the default) nothing is made on either side; the client's metrics
count its adds, reads, recovery opens, ensemble changes and in-flight bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from octavo.cli.localcluster import EtcdProcess
from octavo.client import Client, ClientOptions
from octavo.node.config import NodeConfig
from octavo.node.server import BookieServer
from octavo.telemetry import JsonFormatter

PW = b"pw"
FAST = ClientOptions(add_timeout_s=2.0, read_timeout_s=3.0, metadata_timeout_s=2.0, bookie_list_ttl_s=0.2,
                     ensemble_change_wait_s=5.0)


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


@contextlib.asynccontextmanager
async def bookies(etcd: EtcdProcess, root: Path, cluster: str, count: int, tracer_provider: TracerProvider,
                  ratio: float = 0.0) -> AsyncIterator[list[BookieServer]]:
    servers = [BookieServer(NodeConfig(data_dir=str(root / f"b{i}"), port=0, etcd=etcd.endpoint, cluster=cluster,
                                       trace_sample_ratio=ratio, autorecovery_enabled=False,
                                       registration_ttl_s=2), tracer_provider=tracer_provider)
               for i in range(count)]
    try:
        for server in servers:
            await server.start()
        yield servers
    finally:
        for server in servers:
            await server.stop()


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_a_sampled_append_reaches_every_bookie_span_under_its_trace(etcd: EtcdProcess, tmp_path: Path,
                                                                         cluster_name: str) -> None:
    bookie_tp, bookie_spans = provider()
    client_tp, client_spans = provider()
    options = ClientOptions(**{**FAST.__dict__, "trace_sample_ratio": 1.0})
    async with bookies(etcd, tmp_path, cluster_name, 3, bookie_tp), \
            Client(etcd.endpoint, cluster_name, options, tracer_provider=client_tp) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"x" * 100] * 50)
        append = by_name(client_spans.get_finished_spans(), "octavo.append")
        assert len(append) == 1
        trace_id = append[0].context.trace_id

        async def spans_of(name: str, trace_id: int, count: int) -> list[ReadableSpan]:
            """The bookie spans of a trace, once `count` have ended (the append returned at the ack quorum:
            the third bookie may still be answering)."""
            for _ in range(100):
                found = [s for s in by_name(bookie_spans.get_finished_spans(), name) if s.context.trace_id == trace_id]
                if len(found) >= count:
                    break
                await asyncio.sleep(0.05)
            return found

        adds = await spans_of("octavo.bookie.add", trace_id, 3)
        # One request per bookie carried the append's entries; each bookie's span is a child of the append.
        assert len(adds) == 3
        assert {s.parent.span_id for s in adds if s.parent} == {append[0].context.span_id}
        assert {s.attributes["octavo.bookie_id"] for s in adds} == set(writer.metadata.last_ensemble)
        assert all(s.attributes["octavo.entries"] == 50 for s in adds)
        assert by_name(client_spans.get_finished_spans(), "octavo.create_ledger")

        # A recovery open by another client: its fences join its trace on every bookie.
        async with Client(etcd.endpoint, cluster_name, options, tracer_provider=client_tp) as other:
            reader = await other.open_ledger(writer.ledger_id, password=PW)
            assert [e.data async for e in reader.read(0, 49)] == [b"x" * 100] * 50
        recovery = by_name(client_spans.get_finished_spans(), "octavo.recovery_open")
        assert len(recovery) == 1
        fences = await spans_of("octavo.bookie.fence", recovery[0].context.trace_id, 3)
        assert len(fences) == 3
        reads = by_name(client_spans.get_finished_spans(), "octavo.read")
        assert reads
        read_ids = {s.context.trace_id for s in reads}
        assert [s for s in by_name(bookie_spans.get_finished_spans(), "octavo.bookie.read")
                if s.context.trace_id in read_ids]


async def test_with_sampling_off_no_span_is_made(etcd: EtcdProcess, tmp_path: Path, cluster_name: str) -> None:
    bookie_tp, bookie_spans = provider()
    client_tp, client_spans = provider()
    async with bookies(etcd, tmp_path, cluster_name, 3, bookie_tp), \
            Client(etcd.endpoint, cluster_name, FAST, tracer_provider=client_tp) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"y" * 10] * 20)
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, password=PW)
        assert len([e async for e in reader.read(0, 19)]) == 20
    assert client_spans.get_finished_spans() == ()
    assert bookie_spans.get_finished_spans() == ()


async def test_bookies_sample_root_requests_at_their_own_ratio(etcd: EtcdProcess, tmp_path: Path,
                                                               cluster_name: str) -> None:
    bookie_tp, bookie_spans = provider()
    async with bookies(etcd, tmp_path, cluster_name, 3, bookie_tp, ratio=1.0), \
            Client(etcd.endpoint, cluster_name, FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"z"] * 10)
    adds = by_name(bookie_spans.get_finished_spans(), "octavo.bookie.add")
    assert adds and all(s.parent is None for s in adds)  # roots: the client sampled nothing


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


async def test_client_metrics_count_adds_reads_recoveries_and_ensemble_changes(
        etcd: EtcdProcess, tmp_path: Path, cluster_name: str) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    tp, _ = provider()
    client_tp, client_spans = provider()
    options = ClientOptions(**{**FAST.__dict__, "trace_sample_ratio": 1.0})
    async with bookies(etcd, tmp_path, cluster_name, 4, tp) as servers, \
            Client(etcd.endpoint, cluster_name, options, meter_provider=meters, tracer_provider=client_tp) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"a" * 1000] * 200)
        seen = points(reader)
        assert seen["octavo.client.add.latency"][0].count >= 1
        assert seen["octavo.client.add.in_flight_bytes"][0].value == 0  # everything acknowledged
        ensemble = writer.metadata.last_ensemble
        stopped = next(s for s in servers if s.bookie_id == ensemble[0])
        await stopped.stop()
        pending = asyncio.ensure_future(writer.append_many([b"b" * 1000] * 100))
        await asyncio.wait_for(pending, 30)  # acknowledged by the two others (Qa = 2)
        for _ in range(300):  # the failed bookie is replaced in the background
            if writer.ensemble_changes:
                break
            await asyncio.sleep(0.05)
        seen = points(reader)
        assert seen["octavo.client.ensemble_changes"][0].value == 1
        changes = by_name(client_spans.get_finished_spans(), "octavo.ensemble_change")
        assert len(changes) == 1 and changes[0].attributes["octavo.failed_bookie"] == stopped.bookie_id
        assert changes[0].attributes["octavo.replacement_bookie"] in writer.metadata.last_ensemble
        await writer.close()
        handle = await client.open_ledger(writer.ledger_id, password=PW)
        assert len([e async for e in handle.read(0, 299)]) == 300
        seen = points(reader)
        assert seen["octavo.client.read.latency"][0].count >= 1
        assert "octavo.client.recovery_opens" not in seen  # the ledger was closed: no recovery needed
        writer2 = await client.create_ledger(3, 3, 2, password=PW)
        await writer2.append_many([b"c"] * 5)
        await client.open_ledger(writer2.ledger_id, password=PW)
        assert points(reader)["octavo.client.recovery_opens"][0].value == 1


def test_json_logs_carry_fields_and_the_trace_id() -> None:
    tp, _ = provider()
    formatter = JsonFormatter(service="octavo-test")
    record = logging.LogRecord("octavo.client.writer", logging.INFO, __file__, 1, "ledger %d: bookie %s replaced",
                               (7, "b1"), None)
    record.ledger_id = 7
    record.bookie_id = "b1"
    with tp.get_tracer("t").start_as_current_span("op") as span:
        line = json.loads(formatter.format(record))
    assert line["message"] == "ledger 7: bookie b1 replaced"
    assert line["ledger_id"] == 7 and line["bookie_id"] == "b1" and line["service"] == "octavo-test"
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert line["level"] == "INFO" and line["logger"] == "octavo.client.writer"
    plain = json.loads(formatter.format(logging.LogRecord("x", logging.WARNING, __file__, 1, "no span", (), None)))
    assert "trace_id" not in plain


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_bad_sampling_ratio_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"trace_sample_ratio must be in \[0, 1\]"):
        ClientOptions(trace_sample_ratio=ratio)


async def test_healthz_follows_the_health_callback() -> None:
    """/healthz: 200 while the process serves, 503 once it does not (a bookie stopping); absent without one."""
    from octavo.telemetry import MetricsEndpoint

    serving = [True]
    endpoint = MetricsEndpoint(lambda: b"", lambda: serving[0])
    port = await endpoint.start("127.0.0.1", 0)
    plain = MetricsEndpoint(lambda: b"")
    plain_port = await plain.start("127.0.0.1", 0)

    async def get(at: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", at)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await reader.read()
        writer.close()
        return data

    try:
        assert (await get(port)).startswith(b"HTTP/1.1 200")
        serving[0] = False
        answer = await get(port)
        assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(b"not serving\n")
        assert (await get(plain_port)).startswith(b"HTTP/1.1 404")
    finally:
        await endpoint.stop()
        await plain.stop()
