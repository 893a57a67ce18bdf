"""The bookie as a real process over real gRPC: the protocol, every bad input, health, reflection, status,
graceful shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from octavo.node.testing import BookieConnection, BookieProcess, payload_for
from octavo.v1 import bookie_pb2 as pb

KEY = b"server-test-key"
SMALL = ["--entry-size-bytes-max", "65536", "--batch-bytes-max", "262144", "--batch-entries-max", "500",
         "--read-bytes-max", "131072", "--write-cache-entries-max", "20000", "--log-size-bytes-max", "1048576"]


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(str(tmp_path_factory.mktemp("server") / "bookie"), args=SMALL)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def conn(bookie: BookieProcess) -> Iterator[BookieConnection]:
    with BookieConnection(bookie.address) as c:
        yield c


_ledger = iter(range(1000, 10**6))


def new_ledger() -> int:
    return next(_ledger)


def test_adds_on_one_stream_for_several_ledgers_then_reads(conn: BookieConnection) -> None:
    a, b = new_ledger(), new_ledger()
    requests = [pb.AddRequest(request_id=i, ledgers=[
        pb.LedgerAdds(ledger_id=a, master_key=KEY, entry_ids=list(range(i * 100, i * 100 + 100)),
                      payloads=[payload_for(a, e) for e in range(i * 100, i * 100 + 100)],
                      last_add_confirmed=i * 100 - 1),
        pb.LedgerAdds(ledger_id=b, master_key=KEY, entry_ids=[i], payloads=[payload_for(b, i, 5000)]),
    ]) for i in range(10)]
    responses = conn.add_requests(requests)
    assert [r.request_id for r in responses] == list(range(10))
    for r in responses:
        assert not r.error
        assert [res.ledger_id for res in r.results] == [a, b]
        assert list(r.results[0].codes) == [pb.OK] * 100 and list(r.results[1].codes) == [pb.OK]
    got = conn.read_all(a, 0, 999)
    assert all(got[e] == (pb.OK, payload_for(a, e)) for e in range(1000))
    assert conn.read_all(b, 0, 9)[9] == (pb.OK, payload_for(b, 9, 5000))
    lac = conn.read_lac(a)
    assert (lac.code, lac.last_add_confirmed, lac.last_entry_id, lac.fenced) == (pb.OK, 899, 999, False)


def test_reads_respect_entry_and_byte_limits(conn: BookieConnection) -> None:
    ledger = new_ledger()
    for first in range(0, 60, 20):
        ids = list(range(first, first + 20))
        conn.add(ledger, KEY, ids, [payload_for(ledger, e, 10_000) for e in ids])
    resp = conn.read(ledger, 0, 59)
    assert len(resp.entries) == 13  # 13 x 10,000 bytes fit in read_bytes_max=131072
    resp = conn.read(ledger, 0, 59, max_entries=5)
    assert [e.entry_id for e in resp.entries] == [0, 1, 2, 3, 4]
    resp = conn.read(ledger, 58, 70)
    assert [(e.entry_id, e.code) for e in resp.entries] == [(58, pb.OK), (59, pb.OK), (60, pb.NO_SUCH_ENTRY)]


@pytest.mark.parametrize("case", [
    "wrong_key", "entry_too_large", "negative_entry", "negative_ledger", "mismatched_lists", "empty_key",
    "duplicate_mismatch",
])
def test_bad_adds_get_a_code_and_a_message(conn: BookieConnection, case: str) -> None:
    ledger = new_ledger()
    conn.add(ledger, KEY, [0], [b"first"])
    args: dict[str, object] = {"ledger_id": ledger, "master_key": KEY, "entry_ids": [1], "payloads": [b"x"]}
    expected = {
        "wrong_key": (pb.UNAUTHORIZED, f"wrong master key for ledger {ledger}", {"master_key": b"nope"}),
        "entry_too_large": (pb.TOO_LARGE, "over entry_size_bytes_max=65536", {"payloads": [b"x" * 65537]}),
        "negative_entry": (pb.INVALID, "entry id must be non-negative", {"entry_ids": [-2]}),
        "negative_ledger": (pb.INVALID, "ledger id must be non-negative", {"ledger_id": -7}),
        "mismatched_lists": (pb.INVALID, "1 entry ids but 2 payloads", {"payloads": [b"a", b"b"]}),
        "empty_key": (pb.INVALID, "master key must be 1 to", {"master_key": b""}),
        "duplicate_mismatch": (pb.DUPLICATE_MISMATCH, "already stored with different bytes", {"entry_ids": [0]}),
    }[case]
    code, text, override = expected
    args.update(override)
    resp = conn.add(**args)  # type: ignore[arg-type]
    assert not resp.error
    assert list(resp.results[0].codes) == [code]
    assert text in resp.results[0].message
    assert conn.read_all(ledger, 0, 0) == {0: (pb.OK, b"first")}


def test_fenced_ledger_refuses_its_writer(conn: BookieConnection) -> None:
    ledger = new_ledger()
    conn.add(ledger, KEY, [0, 1], [b"a", b"b"], last_add_confirmed=0)
    wrong = conn.read_lac(ledger, fence=True, master_key=b"other")
    assert wrong.code == pb.UNAUTHORIZED
    lac = conn.read_lac(ledger, fence=True, master_key=KEY)
    assert (lac.code, lac.fenced, lac.last_add_confirmed, lac.last_entry_id) == (pb.OK, True, 0, 1)
    resp = conn.add(ledger, KEY, [2], [b"c"])
    assert list(resp.results[0].codes) == [pb.FENCED] and "fenced" in resp.results[0].message
    resp = conn.add(ledger, KEY, [2], [b"c"], recovery=True)
    assert list(resp.results[0].codes) == [pb.OK]


def test_batch_over_its_limits_is_refused_whole(conn: BookieConnection) -> None:
    ledger = new_ledger()
    resp = conn.add(ledger, KEY, list(range(501)), [b"x"] * 501)
    assert resp.error == pb.TOO_LARGE and "over batch_entries_max=500" in resp.error_message
    resp = conn.add(ledger, KEY, list(range(5)), [b"y" * 60_000] * 5)
    assert resp.error == pb.TOO_LARGE and "over batch_bytes_max=262144" in resp.error_message
    assert conn.read(ledger, 0, 0).error == pb.NO_SUCH_LEDGER  # nothing of either was written


def flat(request_id: int, groups: list[tuple[int, bytes, list[int], list[bytes]]], **columns: object) -> pb.AddRequest:
    """A flat-form request (what the client library sends): one group per (ledger, key, ids, payloads)."""
    fields: dict[str, object] = dict(
        request_id=request_id, group_ledger_ids=[g[0] for g in groups], group_master_keys=[g[1] for g in groups],
        group_lacs=[-1] * len(groups), group_entry_counts=[len(g[2]) for g in groups],
        entry_ids=[e for g in groups for e in g[2]], payloads=[p for g in groups for p in g[3]])
    fields.update(columns)
    return pb.AddRequest(**fields)  # type: ignore[arg-type]


def test_flat_form_stores_many_ledgers_and_lists_only_refused_groups(conn: BookieConnection) -> None:
    a, b, c = new_ledger(), new_ledger(), new_ledger()
    conn.add(c, KEY, [0], [b"c0"])
    conn.read_lac(c, fence=True, master_key=KEY)
    groups = [(a, KEY, [0, 1, 2], [b"a0", b"a1", b"a2"]), (b, KEY, [0], [b"b0"]), (c, KEY, [1], [b"c1"]),
              (a, KEY, [3], [b"a3"]), (b, b"another key", [1], [b"b1"])]
    resp = conn.add_requests([flat(7, groups)])[0]
    assert resp.request_id == 7 and not resp.error and resp.group_count == 5
    refused = {r.group: (list(r.codes), r.message) for r in resp.refused_groups}
    assert sorted(refused) == [2, 4]
    assert refused[2][0] == [pb.FENCED] and "fenced" in refused[2][1]
    assert refused[4][0] == [pb.UNAUTHORIZED]
    assert conn.read_all(a, 0, 3) == {i: (pb.OK, b"a%d" % i) for i in range(4)}
    assert conn.read_all(b, 0, 0) == {0: (pb.OK, b"b0")}
    # A LAC-only group (no entries) is answered as stored and moves the bookie's LAC.
    resp = conn.add_requests([flat(8, [(a, KEY, [], [])], group_lacs=[3])])[0]
    assert resp.group_count == 1 and not resp.refused_groups
    assert conn.read_lac(a).last_add_confirmed == 3


@pytest.mark.parametrize(("columns", "text"), [
    ({"group_lacs": []}, "group columns differ in length"),
    ({"group_recovery": [True, False, True]}, "group columns differ in length"),
    ({"group_entry_counts": [1, 2]}, "group entry counts add up to 3, with 2 entry ids and 2 payloads"),
    ({"payloads": [b"x"]}, "with 2 entry ids and 1 payloads"),
    ({"ledgers": [pb.LedgerAdds(ledger_id=1, master_key=KEY)]}, "either ledgers or group columns"),
])
def test_malformed_flat_requests_are_refused_whole(conn: BookieConnection, columns: dict[str, object],
                                                   text: str) -> None:
    a, b = new_ledger(), new_ledger()
    resp = conn.add_requests([flat(9, [(a, KEY, [0], [b"x"]), (b, KEY, [0], [b"y"])], **columns)])[0]
    assert resp.error == pb.INVALID and text in resp.error_message
    assert conn.read(a, 0, 0).error == pb.NO_SUCH_LEDGER and conn.read(b, 0, 0).error == pb.NO_SUCH_LEDGER


def test_flat_request_over_the_batch_limits_is_refused_whole(conn: BookieConnection) -> None:
    a, b = new_ledger(), new_ledger()
    resp = conn.add_requests([flat(10, [(a, KEY, list(range(300)), [b"x"] * 300),
                                        (b, KEY, list(range(201)), [b"y"] * 201)])])[0]
    assert resp.error == pb.TOO_LARGE and "501 entries, over batch_entries_max=500" in resp.error_message
    assert conn.read(a, 0, 0).error == pb.NO_SUCH_LEDGER


def test_message_over_the_transport_limit_is_a_grpc_status(conn: BookieConnection) -> None:
    ledger = new_ledger()
    with pytest.raises(grpc.RpcError) as e:
        conn.add(ledger, KEY, [0], [b"z" * (3 * 1024 * 1024)])
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_bad_reads(conn: BookieConnection) -> None:
    resp = conn.read(new_ledger(), 0, 5)
    assert resp.error == pb.NO_SUCH_LEDGER and "is not known to this bookie" in resp.error_message
    resp = conn.read(1000, 5, 2)
    assert resp.error == pb.INVALID and "first <= last" in resp.error_message
    resp = conn.read(1000, -1, 2)
    assert resp.error == pb.INVALID
    assert conn.read_lac(new_ledger()).code == pb.NO_SUCH_LEDGER
    assert conn.read_lac(new_ledger(), fence=True).code == pb.INVALID  # a fence needs the master key


def test_write_close(conn: BookieConnection) -> None:
    ledger = new_ledger()
    conn.add(ledger, KEY, [0], [b"a"])
    assert conn.bookie.WriteClose(pb.WriteCloseRequest(ledger_id=ledger, master_key=KEY)).code == pb.OK
    assert conn.bookie.WriteClose(pb.WriteCloseRequest(ledger_id=ledger, master_key=b"x")).code == pb.UNAUTHORIZED
    assert conn.bookie.WriteClose(pb.WriteCloseRequest(ledger_id=new_ledger(), master_key=KEY)).code \
        == pb.NO_SUCH_LEDGER


def tail(conn: BookieConnection, ledger: int) -> pb.ReadResponse:
    """A tailing read that does not wait: its answer says whether the writer closed the ledger here."""
    return conn.bookie.ReadTail(pb.ReadTailRequest(ledger_id=ledger, previous_lac=-1, wait_ms=0, max_entries=1))


def test_write_closes_ride_the_add_stream(conn: BookieConnection) -> None:
    """Closes carried by an add request are done before its adds (the flag reaches readers), refusals are listed
    by index, a request with only closes is answered, and malformed close columns refuse the whole request."""
    a, b, c, e = new_ledger(), new_ledger(), new_ledger(), new_ledger()
    conn.add(b, KEY, [0], [b"b0"])
    conn.add(e, KEY, [0], [b"e0"])
    resp = conn.add_requests([flat(20, [(a, KEY, [0, 1], [b"a0", b"a1"])], close_ledger_ids=[e, b, c, b],
                                   close_master_keys=[KEY, KEY, KEY, b"x"], close_last_entry_ids=[0, 0, 0, 0])])[0]
    assert not resp.error and resp.group_count == 1 and not resp.refused_groups
    refused = {r.group: (list(r.codes), r.message) for r in resp.refused_closes}
    assert sorted(refused) == [2, 3]
    assert refused[2][0] == [pb.NO_SUCH_LEDGER] and refused[3][0] == [pb.UNAUTHORIZED]
    assert tail(conn, e).write_closed and tail(conn, b).write_closed and not tail(conn, a).write_closed
    assert conn.read_all(a, 0, 1) == {0: (pb.OK, b"a0"), 1: (pb.OK, b"a1")}
    # A closed ledger is sealed: its writer's next add is refused.
    assert conn.add(b, KEY, [1], [b"b1"]).results[0].codes == [pb.FENCED]
    d = new_ledger()
    conn.add(d, KEY, [0], [b"d0"])
    resp = conn.add_requests([pb.AddRequest(request_id=21, close_ledger_ids=[d], close_master_keys=[KEY],
                                            close_last_entry_ids=[0])])[0]
    assert not resp.error and resp.group_count == 0 and not resp.refused_closes
    assert tail(conn, d).write_closed
    e = new_ledger()
    resp = conn.add_requests([flat(22, [(e, KEY, [0], [b"e0"])], close_ledger_ids=[e], close_master_keys=[],
                                   close_last_entry_ids=[0])])[0]
    assert resp.error == pb.INVALID and "close columns differ in length" in resp.error_message


def test_malformed_bytes_get_a_status_and_the_server_lives(bookie: BookieProcess, conn: BookieConnection) -> None:
    raw = conn.channel.unary_unary("/octavo.v1.Bookie/ReadEntries", request_serializer=None,
                                   response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\xff\xff\xff\xff not a protobuf", timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed octavo.v1.ReadRequest" in (e.value.details() or "")
    stream = conn.channel.stream_stream("/octavo.v1.Bookie/AddEntries", request_serializer=None,
                                        response_deserializer=None)
    good = pb.AddRequest(request_id=1, ledgers=[pb.LedgerAdds(ledger_id=new_ledger(), master_key=KEY,
                                                              entry_ids=[0], payloads=[b"a"])])
    with pytest.raises(grpc.RpcError) as e:
        list(stream(iter([good.SerializeToString(), b"\x0a\xff garbage"]), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed octavo.v1.AddRequest" in (e.value.details() or "")
    assert bookie.alive()
    assert conn.status().bookie_id


GARBAGE = b"\xff\xff\xff\xff not a protobuf"  # a field tag with wire type 7: no message type parses it
FLOOD_REQUESTS = 200  # per method
NOT_SERVED = {"/grpc.health.v1.Health/List"}  # newer than grpc's health servicer: UNIMPLEMENTED, before parsing


def _every_method() -> list[tuple[str, str, bool, bool]]:
    """(path, request type, client streaming, server streaming) of every method the bookie serves, from the
    descriptors: a method added later is covered without touching this test."""
    services = [pb.DESCRIPTOR.services_by_name["Bookie"], pb.DESCRIPTOR.services_by_name["BookieAdmin"],
                health_pb2.DESCRIPTOR.services_by_name["Health"],
                reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]]
    return [(f"/{s.full_name}/{m.name}", m.input_type.full_name, m.client_streaming, m.server_streaming)
            for s in services for m in s.methods]


def _call_raw(channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool) -> grpc.RpcError:
    def call() -> None:
        if client_streaming:
            list(channel.stream_stream(path)(iter([GARBAGE]), timeout=10))
        elif server_streaming:
            list(channel.unary_stream(path)(GARBAGE, timeout=10))
        else:
            channel.unary_unary(path)(GARBAGE, timeout=10)

    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def test_a_flood_of_garbage_on_every_method_gets_statuses_and_bounded_log_lines(bookie: BookieProcess,
                                                                                 conn: BookieConnection) -> None:
    """Unauthenticated garbage on any method (our planes, health, reflection): INVALID_ARGUMENT naming the
    request type, never UNKNOWN; the log grows by a bounded number of lines, never a traceback; the bookie
    serves on."""
    methods = _every_method()
    assert len(methods) - len(NOT_SERVED) >= 14  # 5 data plane, 6 admin plane, 2 health, 1 reflection
    log_bytes_before = Path(bookie.log_path).stat().st_size
    for path, request_type, client_streaming, server_streaming in methods:
        for _ in range(FLOOD_REQUESTS):
            error = _call_raw(conn.channel, path, client_streaming, server_streaming)
            if path in NOT_SERVED:
                assert error.code() == grpc.StatusCode.UNIMPLEMENTED, (path, error.code(), error.details())
                continue
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, error.code(), error.details())
            assert f"malformed {request_type}: " in (error.details() or ""), (path, error.details())
    assert bookie.alive()
    health = health_pb2_grpc.HealthStub(conn.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert conn.status().bookie_id
    with open(bookie.log_path, errors="replace") as f:
        f.seek(log_bytes_before)
        grown = f.read().splitlines()
    assert not [line for line in grown if "Traceback" in line], "\n".join(grown[:40])
    # At most 10 lines per request type per minute (ratelimitedlog.LINES_MAX), however many requests came.
    bad_request_lines = [line for line in grown if "bad request from " in line]
    assert len(bad_request_lines) <= 10 * len({m[1] for m in methods}), "\n".join(grown[:40])
    assert len(grown) <= len(bad_request_lines) + 20, "\n".join(grown[:40])
    assert all(len(line) < 600 for line in grown)


def test_health_watch_and_unknown_services(conn: BookieConnection) -> None:
    """Health as grpc's own servicer answers it: Watch streams the status, an unknown service is NOT_FOUND on
    Check and SERVICE_UNKNOWN on Watch."""
    health = health_pb2_grpc.HealthStub(conn.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service="octavo.v1.Bookie"), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    with pytest.raises(grpc.RpcError) as e:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    unknown = health.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    unknown.cancel()


def test_unknown_method_is_unimplemented(conn: BookieConnection) -> None:
    raw = conn.channel.unary_unary("/octavo.v1.Bookie/NoSuchMethod", request_serializer=None,
                                   response_deserializer=None)
    with pytest.raises(grpc.RpcError) as e:
        raw(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_health_and_reflection(conn: BookieConnection) -> None:
    health = health_pb2_grpc.HealthStub(conn.channel)
    for service in ("", "octavo.v1.Bookie", "octavo.v1.BookieAdmin"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(conn.channel)
    responses = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               timeout=10))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"octavo.v1.Bookie", "octavo.v1.BookieAdmin", "grpc.health.v1.Health"} <= names


def test_status_reports_what_it_should(bookie: BookieProcess, conn: BookieConnection) -> None:
    st = conn.status()
    assert st.address == bookie.address and st.mode == pb.MODE_WRITABLE
    assert st.directories[0].total_bytes > 0 and 0 <= st.directories[0].usage_ratio <= 1
    assert st.write_cache.entries_max == 20000 and st.fsync_policy == "none"
    assert st.entry_log_count == len(st.entry_logs) >= 1
    assert st.active_log_id in {log.log_id for log in st.entry_logs if log.state == "active"}


def test_cli_status_human_and_json(bookie: BookieProcess) -> None:
    human = subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", "status", "--bookie", bookie.address],
                           capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and "recovery point" in human.stdout
    out = subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", "status", "--bookie", bookie.address,
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["address"] == bookie.address
    down = subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", "status", "--bookie",
                           "127.0.0.1:1", "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "cannot reach bookie 127.0.0.1:1" in down.stderr


def test_sigterm_is_graceful_and_the_next_start_replays_nothing(tmp_path: Path) -> None:
    proc = BookieProcess(str(tmp_path / "b"), args=SMALL)
    with BookieConnection(proc.start()) as c:
        for first in range(0, 2000, 400):
            ids = list(range(first, first + 400))
            c.add(1, KEY, ids, [payload_for(1, e, 500) for e in ids])
    assert proc.stop() == 0
    with BookieConnection(proc.start()) as c:
        st = c.status()
        assert not st.last_start_was_unclean and st.recovery_logs_scanned == 0
        got = c.read_all(1, 0, 1999)
        assert all(got[e] == (pb.OK, payload_for(1, e, 500)) for e in range(2000))
    proc.kill()
    with BookieConnection(proc.start()) as c:
        st = c.status()
        assert st.last_start_was_unclean and st.unclean_restart_count == 1 and st.recovery_logs_scanned >= 1
    proc.stop()


def test_bad_configuration_exits_non_zero_with_a_message(tmp_path: Path) -> None:
    cfg = tmp_path / "bookie.toml"
    cfg.write_text('data_dir = "x"\nlog_size_bytez_max = 5\n')
    run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown setting(s)" in run.stderr and "log_size_bytez_max" in run.stderr
    run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(tmp_path / "d"),
                          "--port", "abc"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "port must be an integer" in run.stderr


def test_second_bookie_on_a_used_directory_exits_with_a_message(bookie: BookieProcess) -> None:
    run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", bookie.data_dir,
                          "--port", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "in use by another bookie" in run.stderr
