"""Arguments of the wrong type: a TypeError naming the argument and the type it takes, before anything is sent.
The pure checks first, then the public API on a real local cluster (Client, SyncClient, the handles, datasets)."""

from __future__ import annotations

import array
from collections.abc import Iterator
from typing import Any

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions, SyncClient
from octavo.client.arguments import (
    check_bool,
    check_bytes,
    check_entry_list,
    check_float,
    check_int,
    check_str,
    check_str_map,
)
from octavo.client.dataset import DatasetLedger, DatasetStore

PW = b"arguments"
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, speculative_read_delay_s=0.1, metadata_timeout_s=2.0)


# -- the pure checks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "message"), [
    ("3", "n must be an int, got str"), (3.0, "n must be an int, got float"), (True, "n must be an int, got bool"),
    (None, "n must be an int, got NoneType"), (b"3", "n must be an int, got bytes"),
])
def test_check_int_refuses_what_is_not_an_int(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=f"^{message}$"):
        check_int("n", value)


def test_check_int_takes_ints_and_index_types_within_the_range() -> None:
    class Index:
        def __index__(self) -> int:
            return 7

    assert check_int("n", 5) == 5 and check_int("n", Index()) == 7
    assert check_int("n", 0, minimum=0, maximum=0) == 0
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1$"):
        check_int("n", -1, minimum=0)
    with pytest.raises(ValueError, match=r"^n must be <= 9, got 10$"):
        check_int("n", 10, maximum=9)


def test_check_bytes_takes_bytes_like_only() -> None:
    assert check_bytes("data", b"ab") == b"ab"
    assert check_bytes("data", bytearray(b"ab")) == b"ab"
    assert check_bytes("data", memoryview(b"xaby")[1:3]) == b"ab"
    assert type(check_bytes("data", bytearray(b"ab"))) is bytes
    assert check_bytes("data", memoryview(array.array("B", [1, 2]))) == b"\x01\x02"
    with pytest.raises(TypeError, match=r"^data must be bytes, bytearray or memoryview, got str \(encode it"):
        check_bytes("data", "ab")
    for bad in (1, None, [1, 2], 1.5):
        with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
            check_bytes("data", bad)


def test_check_entry_list_refuses_one_entry_or_a_non_iterable() -> None:
    for fine in ([b"a"], (b"a",), iter([b"a"]), []):
        check_entry_list("entries", fine)
    with pytest.raises(TypeError, match=r"^entries must be a list of entries \(bytes, bytearray or memoryview "
                                        r"each\), got bytes \(append takes one entry\)$"):
        check_entry_list("entries", b"abc")
    for bad in ("abc", 5, None):
        with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
            check_entry_list("entries", bad)


def test_check_str_map() -> None:
    assert check_str_map("metadata", None) == {}
    given = {"a": "b"}
    copy = check_str_map("metadata", given)
    assert copy == given and copy is not given
    with pytest.raises(TypeError, match=r"^metadata\['k'\] must be a str, got bytes \(it is stored as text"):
        check_str_map("metadata", {"k": b"v"})
    with pytest.raises(TypeError, match=r"^metadata\['k'\] must be a str, got int$"):
        check_str_map("metadata", {"k": 1})
    with pytest.raises(TypeError, match=r"^metadata keys must be str, got int \(1\)$"):
        check_str_map("metadata", {1: "v"})
    with pytest.raises(TypeError, match=r"^metadata must be a dict of str to str, got list$"):
        check_str_map("metadata", [("k", "v")])
    with pytest.raises(TypeError, match=r"^metadata\['kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\] must"):
        check_str_map("metadata", {"k" * 10_000: 1})  # a long key is cut in the message


def test_check_bool_str_float() -> None:
    assert check_bool("b", False) is False
    with pytest.raises(TypeError, match=r"^b must be a bool, got str$"):
        check_bool("b", "no")
    with pytest.raises(TypeError, match=r"^s must be a str, got bytes$"):
        check_str("s", b"x")
    assert check_float("t", 2) == 2.0
    with pytest.raises(TypeError, match=r"^t must be a number, got str$"):
        check_float("t", "2")
    with pytest.raises(ValueError, match=r"^t must be >= 0, got nan$"):
        check_float("t", float("nan"), minimum=0)


# -- the public API, for real -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("arguments")), bookies=3) as c:
        yield c


async def test_client_calls_name_the_argument_and_its_type(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        refusals = [
            (client.create_ledger("3"), "ensemble_size must be an int, got str"),  # type: ignore[arg-type]
            (client.create_ledger(3, 3.0), "write_quorum must be an int, got float"),  # type: ignore[arg-type]
            (client.create_ledger(3, 3, True), "ack_quorum must be an int, got bool"),
            (client.create_ledger(3, 3, 2, "pw"), "password must be bytes, bytearray or memoryview, got str"),  # type: ignore[arg-type]
            (client.create_ledger(3, 3, 2, PW, {"k": b"v"}), "metadata['k'] must be a str, got bytes"),  # type: ignore[dict-item]
            (client.open_ledger("0"), "ledger_id must be an int, got str"),  # type: ignore[arg-type]
            (client.open_ledger(0, "pw"), "password must be bytes, bytearray or memoryview, got str"),  # type: ignore[arg-type]
            (client.open_ledger(0, PW, "no"), "recovery must be a bool, got str"),  # type: ignore[arg-type]
            (client.delete_ledger(None), "ledger_id must be an int, got NoneType"),  # type: ignore[arg-type]
            (client.delete_ledger(0, "pw"), "password must be bytes, bytearray or memoryview, got str"),  # type: ignore[arg-type]
            (client.read_last_add_confirmed(1.0), "ledger_id must be an int, got float"),  # type: ignore[arg-type]
            (client.read_unconfirmed_last_entry(b"1"), "ledger_id must be an int, got bytes"),  # type: ignore[arg-type]
            (client.ledger_metadata("1"), "ledger_id must be an int, got str"),  # type: ignore[arg-type]
        ]
        for call, message in refusals:
            with pytest.raises(TypeError) as e:
                await call
            assert str(e.value).startswith(message), (str(e.value), message)
        with pytest.raises(ValueError, match=r"^ledger_id must be >= 0, got -1$"):
            await client.open_ledger(-1)
        ledgers_before = await client.list_ledgers()
        # bytes-like passwords work, and nothing was created by the refused calls
        writer = await client.create_ledger(3, 3, 2, bytearray(PW), {"app": "arguments"})
        assert await client.list_ledgers() == sorted([*ledgers_before, writer.ledger_id])
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, memoryview(PW))
        assert reader.last_entry_id == -1


async def test_handles_check_entries_and_ranges(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, PW)
        refusals = [
            (writer.append("text"), "data must be bytes, bytearray or memoryview, got str"),  # type: ignore[arg-type]
            (writer.append(None), "data must be bytes, bytearray or memoryview, got NoneType"),  # type: ignore[arg-type]
            (writer.append_many([b"a", "b"]), "entries[1] must be bytes, bytearray or memoryview, got str"),  # type: ignore[list-item]
            (writer.append_many(b"abc"), "entries must be a list of entries (bytes, bytearray or memoryview "
                                         "each), got bytes (append takes one entry)"),
            (writer.append_many("abc"), "entries must be a list of entries"),
            (writer.append_many(5), "entries must be a list of entries (bytes, bytearray or memoryview each), "  # type: ignore[arg-type]
                                    "got int"),
        ]
        for call, message in refusals:
            with pytest.raises(TypeError) as e:
                await call
            assert str(e.value).startswith(message), (str(e.value), message)
        with pytest.raises(TypeError, match=r"^data must be bytes"):
            writer.append_nowait(1)  # type: ignore[arg-type]
        # nothing was appended by the refused calls; bytes-like entries are taken
        assert await writer.append_many([b"a", bytearray(b"b"), memoryview(b"c")]) == [0, 1, 2]
        assert await writer.append(bytearray(b"d")) == 3
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, PW)
        for iterator, message in [(reader.read("0", 3), "first must be an int, got str"),  # type: ignore[arg-type]
                                  (reader.read(0, 3.0), "last must be an int, got float"),  # type: ignore[arg-type]
                                  (reader.read_batches(True, 3), "first must be an int, got bool"),
                                  (reader.read(0, 3, unconfirmed=1), "unconfirmed must be a bool, got int"),  # type: ignore[arg-type]
                                  (reader.tail("0"), "from_entry must be an int, got str"),  # type: ignore[arg-type]
                                  (reader.tail_batches(None), "from_entry must be an int, got NoneType")]:  # type: ignore[arg-type]
            with pytest.raises(TypeError) as e:
                await iterator.__anext__()
            assert str(e.value) == message
        assert [e.data async for e in reader.read(0, 3)] == [b"a", b"b", b"c", b"d"]


def test_sync_client_checks_the_same(cluster: LocalCluster) -> None:
    with SyncClient(cluster.etcd_endpoint, options=FAST) as client:
        with pytest.raises(TypeError, match=r"^ensemble_size must be an int, got str$"):
            client.create_ledger("3")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^metadata\['k'\] must be a str, got bytes"):
            client.create_ledger(3, 3, 2, PW, {"k": b"v"})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"^ledger_id must be an int, got str$"):
            client.open_ledger("0")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^ledger_id must be an int, got str$"):
            client.delete_ledger("0")  # type: ignore[arg-type]
        with client.create_ledger(3, 3, 2, PW) as writer:
            with pytest.raises(TypeError, match=r"^data must be bytes, bytearray or memoryview, got str"):
                writer.append_async("x")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"^entries\[0\] must be bytes"):
                writer.append_many([1])  # type: ignore[list-item]
            assert writer.append(b"ok") == 0
        reader = client.open_ledger(writer.ledger_id, PW)
        with pytest.raises(TypeError, match=r"^last must be an int, got str$"):
            list(reader.read(0, "0"))  # type: ignore[arg-type]
        assert [e.data for e in reader.read(0, 0)] == [b"ok"]


async def test_dataset_store_checks_its_arguments(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        datasets: DatasetStore = client.datasets
        ledger = DatasetLedger(ledger_id=1, rows=1, bytes=1, entries=1)
        schema = '{"fields":[],"type":"struct"}'
        refusals = [
            (datasets.get(7), "name must be a str, got int"),  # type: ignore[arg-type]
            (datasets.has_ledgers(None), "name must be a str, got NoneType"),  # type: ignore[arg-type]
            (datasets.commit("d", b"{}", [ledger]), "schema must be a str, got bytes"),  # type: ignore[arg-type]
            (datasets.commit("d", schema, (ledger,)), "ledgers must be a list of DatasetLedger, got tuple"),  # type: ignore[arg-type]
            (datasets.commit("d", schema, [1]), "ledgers[0] must be a DatasetLedger, got int"),  # type: ignore[list-item]
            (datasets.commit("d", schema, [ledger], stream=("s", "1")), "stream[1] must be an int, got str"),  # type: ignore[arg-type]
            (datasets.commit("d", schema, [ledger], replace=["1"]), "replace[0] must be an int, got str"),  # type: ignore[list-item]
            (datasets.collect_orphans("d", "60"), "grace_s must be a number, got str"),  # type: ignore[arg-type]
        ]
        for call, message in refusals:
            with pytest.raises(TypeError) as e:
                await call
            assert str(e.value) == message
        assert "d" not in await datasets.names()  # nothing committed
