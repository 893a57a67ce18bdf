"""`octavo ledger ls|show|read|delete` against a real cluster, as a user runs them: exit codes, messages,
JSON, confirmation, and the ways of naming the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import LocalCluster, free_port
from octavo.client import SyncClient

OCTAVO = [sys.executable, "-m", "octavo.cli.main"]
WRITER = """
import asyncio, os, sys
from octavo.client import Client
async def main():
    async with Client(sys.argv[1]) as c:
        w = await c.create_ledger(3, 3, 2, password=b"pw")
        await w.append_many([b"entry %d" % i for i in range(1000)])
        print(w.ledger_id, flush=True)
        os._exit(0)  # the writer dies with its ledger open: its bookies' LAC is one batch behind
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cli")), bookies=3) as c:
        yield c


def run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OCTAVO, "ledger", *args], capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ, **(env or {})})


def closed_ledger(etcd: str, entries: list[bytes], password: bytes = b"pw") -> int:
    with SyncClient(etcd) as client, \
            client.create_ledger(3, 3, 2, password=password, metadata={"owner": "tests"}) as writer:
        writer.append_many(entries)
        return writer.ledger_id


def test_ls_show_read_delete(cluster: LocalCluster) -> None:
    etcd = cluster.etcd_endpoint
    ledger = closed_ledger(etcd, [b"alpha", b"beta", b"gamma"])
    listed = run("ls", "--etcd", etcd)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split() == ["LEDGER", "STATE", "ENTRIES", "SIZE",
                                                                                "AGE"]
    row = next(line.split() for line in listed.stdout.splitlines() if line.split()[0] == str(ledger))
    assert row[1:5] == ["closed", "3", "14", "B"]
    rows = json.loads(run("ls", "--etcd", etcd, "--json").stdout)["ledgers"]
    mine = next(r for r in rows if r["ledger_id"] == ledger)
    assert mine["state"] == "CLOSED" and mine["entries"] == 3 and mine["length_bytes"] == 14
    shown = run("show", str(ledger), "--etcd", etcd)
    assert shown.returncode == 0 and "CLOSED, 3 entries (last entry 2), 14 bytes" in shown.stdout
    assert "owner = tests" in shown.stdout
    meta = json.loads(run("show", str(ledger), "--etcd", etcd, "--json").stdout)
    assert meta["state"] == "CLOSED" and "master_key_hex" not in meta and len(meta["password_digest"]) == 64
    read = run("read", str(ledger), "--etcd", etcd, "--password", "pw")
    assert read.returncode == 0 and read.stdout.splitlines() == ["0\talpha", "1\tbeta", "2\tgamma"]
    lines = [json.loads(line) for line in run("read", str(ledger), "--etcd", etcd, "--password", "pw",
                                              "--json").stdout.splitlines()]
    assert [x["entry_id"] for x in lines] == [0, 1, 2] and lines[0]["data_base64"] == "YWxwaGE="
    wrong = run("read", str(ledger), "--etcd", etcd, "--password", "nope")
    assert wrong.returncode == 1 and "wrong password" in wrong.stderr
    refused = run("delete", str(ledger), "--etcd", etcd, "--password", "pw")  # no terminal, no --yes
    assert refused.returncode == 2 and "refusing without --yes" in refused.stderr
    missing = run("delete", str(ledger), "--etcd", etcd, "--yes")  # no password given: says one is needed
    assert missing.returncode == 2 and f"ledger {ledger} has a password" in missing.stderr
    wrong = run("delete", str(ledger), "--etcd", etcd, "--yes", "--password", "nope")
    assert wrong.returncode == 1 and "wrong password" in wrong.stderr
    deleted = run("delete", str(ledger), "--etcd", etcd, "--password", "pw", "--yes")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout and "compaction" in deleted.stdout
    missing = run("show", str(ledger), "--etcd", etcd)
    assert missing.returncode == 1 and f"ledger {ledger} does not exist" in missing.stderr


def test_read_ranges_formats_and_exit_codes(cluster: LocalCluster, tmp_path: Path) -> None:
    etcd = cluster.etcd_endpoint
    ledger = closed_ledger(etcd, [b"text", b"\x00\x01\xff", b"line\nbreak"])
    secret = tmp_path / "secret"
    secret.write_text("pw\n")
    args = ["read", str(ledger), "--etcd", etcd, "--password-file", str(secret)]
    assert run(*args).stdout.splitlines() == ["0\ttext", "1\t0001ff", "2\tline\\nbreak"]
    assert run(*args, "--format", "hex", "--first", "0", "--last", "0").stdout == "0\t74657874\n"
    raw = subprocess.run([*OCTAVO, "ledger", *args, "--format", "raw"], capture_output=True, timeout=120)
    assert raw.stdout == b"text\x00\x01\xffline\nbreak"
    by_env = run("read", str(ledger), "--etcd", etcd, "--first", "2", env={"OCTAVO_PASSWORD": "pw"})
    assert by_env.stdout == "2\tline\\nbreak\n"
    backwards = run(*args, "--first", "2", "--last", "1")
    assert backwards.returncode == 2 and "--last 1 is before --first 2" in backwards.stderr
    for extra in (["--first", "5"], ["--last", "3"], ["--first", "1", "--last", "9"]):
        past = run(*args, *extra)
        assert past.returncode == 1 and "past the last readable entry 2" in past.stderr, extra
    empty = closed_ledger(etcd, [])
    nothing = run("read", str(empty), "--etcd", etcd, "--password", "pw")
    assert nothing.returncode == 0 and nothing.stdout == "" and "no readable entry" in nothing.stderr


def test_an_abandoned_open_ledger_shows_its_lac_and_its_unconfirmed_entries(cluster: LocalCluster) -> None:
    etcd = cluster.etcd_endpoint
    ledger = int(subprocess.run([sys.executable, "-c", WRITER, etcd], capture_output=True, text=True,
                                timeout=120, check=True).stdout)
    # The writer's one batch carried LAC -1 and it died before telling the bookies more: every entry is held
    # by an ack quorum, none is known to be acknowledged.
    shown = run("show", str(ledger), "--etcd", etcd)
    assert "OPEN (a writer may still be appending); last add confirmed -1 as read from its bookies" in shown.stdout
    assert "unconfirmed last entry 999: entries 0..999 are held by an ack quorum" in shown.stdout
    meta = json.loads(run("show", str(ledger), "--etcd", etcd, "--json").stdout)
    assert meta["last_add_confirmed"] == -1 and meta["last_add_confirmed_source"] == "bookies"
    assert meta["unconfirmed_last_entry_id"] == 999
    assert meta["length_bytes"] is None
    with SyncClient(etcd) as client:
        reader = client.open_ledger(ledger, b"pw", recovery=False)
        assert reader.last_entry_id == -1
        assert reader.read_unconfirmed_last_entry() == client.read_unconfirmed_last_entry(ledger) == 999
        assert [e.data for e in reader.read(998, 999, unconfirmed=True)] == [b"entry 998", b"entry 999"]
    nothing = run("read", str(ledger), "--etcd", etcd, "--password", "pw")
    assert nothing.returncode == 0 and nothing.stdout == "" and "--unconfirmed reads entries" in nothing.stderr
    past = run("read", str(ledger), "--etcd", etcd, "--password", "pw", "--first", "998")
    assert past.returncode == 1 and "past the last readable entry -1" in past.stderr and "--unconfirmed" in past.stderr
    read = run("read", str(ledger), "--etcd", etcd, "--password", "pw", "--first", "998", "--unconfirmed")
    assert read.stdout.splitlines() == ["998\tentry 998", "999\tentry 999"]
    both = run("read", str(ledger), "--etcd", etcd, "--password", "pw", "--unconfirmed", "--recover")
    assert both.returncode == 2 and "--unconfirmed" in both.stderr
    recovered = run("read", str(ledger), "--etcd", etcd, "--password", "pw", "--recover", "--first", "999")
    assert recovered.returncode == 0, recovered.stderr
    # Recovery read every entry (the bookies' LAC was -1), so it knows the length.
    meta = json.loads(run("show", str(ledger), "--etcd", etcd, "--json").stdout)
    assert meta["state"] == "CLOSED" and meta["entries"] == 1000
    assert meta["length_bytes"] == sum(len(b"entry %d" % i) for i in range(1000))


def test_a_mistyped_cluster_or_an_unreachable_etcd_fails_at_once(cluster: LocalCluster) -> None:
    etcd = cluster.etcd_endpoint
    typo = run("ls", "--etcd", etcd, "--cluster", "defualt")
    assert typo.returncode == 1 and "cluster 'defualt' has nothing in etcd" in typo.stderr
    assert "clusters there: default" in typo.stderr
    allowed = run("ls", "--etcd", etcd, "--cluster", "defualt", "--allow-empty")
    assert allowed.returncode == 0 and "(no ledgers)" in allowed.stderr
    # The reason comes from a connection attempt made at once, not from a call that waited out its timeout
    # (which could only say DEADLINE_EXCEEDED).
    refused = run("ls", "--etcd", f"127.0.0.1:{free_port()}")
    assert refused.returncode == 1 and "etcd unavailable" in refused.stderr and "connection refused" in refused.stderr
    unknown = run("ls", "--etcd", "no-such-host.invalid:2379")
    assert unknown.returncode == 1 and "cannot resolve 'no-such-host.invalid'" in unknown.stderr
    assert "DEADLINE_EXCEEDED" not in refused.stderr + unknown.stderr
    nowhere = run("ls", env={"OCTAVO_ETCD": "", "OCTAVO_DEV_DIR": ""})
    assert nowhere.returncode == 2 and "where is etcd" in nowhere.stderr
    by_env = run("ls", "--json", env={"OCTAVO_ETCD": etcd})
    assert by_env.returncode == 0 and "ledgers" in json.loads(by_env.stdout)


def test_a_closed_pipe_is_no_traceback(cluster: LocalCluster) -> None:
    ledger = closed_ledger(cluster.etcd_endpoint, [b"x" * 100] * 5000)
    shell = (f"{sys.executable} -m octavo.cli.main ledger read {ledger} --etcd {cluster.etcd_endpoint} "
             "--password pw | head -1")
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("0\t") and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


def test_cluster_check_writes_reads_back_and_cleans_up(cluster: LocalCluster) -> None:
    """`octavo cluster check` (the chart's `helm test`): a ledger written, read back identical, deleted."""
    etcd = cluster.etcd_endpoint
    before = json.loads(run("ls", "--etcd", etcd, "--json").stdout)["ledgers"]
    done = subprocess.run([*OCTAVO, "cluster", "check", "--etcd", etcd, "--entries", "50", "--entry-bytes", "300",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and result["entries"] == 50 and result["mismatched"] == []
    after = json.loads(run("ls", "--etcd", etcd, "--json").stdout)["ledgers"]
    assert {r["ledger_id"] for r in after} == {r["ledger_id"] for r in before}  # deleted again
    assert result["ledger"] not in {r["ledger_id"] for r in after}
    text = subprocess.run([*OCTAVO, "cluster", "check", "--etcd", etcd, "--entries", "5"], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and text.stdout.startswith("ok: ledger "), text.stdout + text.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--entries", "0"], "must be in 1..100000"),
    (["--entry-bytes", "x"], "not an integer"),
    (["--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "3"], "ack_quorum (3) <= write_quorum (2)"),
    (["--ensemble", "9"], "needs 9 writable bookies"),
])
def test_cluster_check_refuses_bad_arguments(cluster: LocalCluster, args: list[str], message: str) -> None:
    done = subprocess.run([*OCTAVO, "cluster", "check", "--etcd", cluster.etcd_endpoint, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 2) and message in done.stderr.lower(), done.stderr
    assert "Traceback" not in done.stderr


def test_read_follow_prints_entries_as_they_come_and_exits_at_the_close(cluster: LocalCluster) -> None:
    etcd = cluster.etcd_endpoint
    with SyncClient(etcd) as client:
        writer = client.create_ledger(3, 3, 2, password=b"pw")
        writer.append_many([b"before %d" % i for i in range(3)])
        follow = subprocess.Popen([*OCTAVO, "ledger", "read", str(writer.ledger_id), "--etcd", etcd, "--password",
                                   "pw", "--follow", "--first", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            assert follow.stdout is not None
            # What is there first (read line by line: communicate() below bypasses this file's buffer).
            assert [follow.stdout.readline(), follow.stdout.readline()] == ["1\tbefore 1\n", "2\tbefore 2\n"]
            for i in range(5):
                writer.append(b"after %d" % i)
            writer.close()
            out, err = follow.communicate(timeout=60)
        finally:
            follow.kill()
    assert follow.returncode == 0, err
    assert out.splitlines() == [f"{3 + i}\tafter {i}" for i in range(5)]
    usage = run("read", str(writer.ledger_id), "--etcd", etcd, "--password", "pw", "--follow", "--last", "3")
    assert usage.returncode == 2 and "--follow reads until the ledger is closed" in usage.stderr


def test_messages_say_what_is_wrong(cluster: LocalCluster) -> None:
    """Issue 29, item 10: an unknown bookie id, a ledger read without its password, a misspelled cluster in the
    library, a forced bookie in `cluster status`, the mode said once."""
    etcd = cluster.etcd_endpoint
    octavo = [*OCTAVO]
    unknown = subprocess.run([*octavo, "bookie", "status", "--bookie", "bookie-9", "--etcd", etcd],
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "bookie 'bookie-9' is not registered in cluster 'default'" in unknown.stderr
    assert "registered: bookie-0, bookie-1, bookie-2" in unknown.stderr and "DNS" not in unknown.stderr
    typo = subprocess.run([*octavo, "bookie", "status", "--bookie", "bookie-9", "--etcd", etcd, "--cluster",
                           "defualt"], capture_output=True, text=True, timeout=60)
    assert typo.returncode == 1 and "cluster 'defualt' has nothing in etcd" in typo.stderr, typo.stderr

    ledger = closed_ledger(etcd, [b"secret"])
    no_password = run("read", str(ledger), "--etcd", etcd, env={"OCTAVO_PASSWORD": ""})
    assert no_password.returncode == 2 and f"ledger {ledger} has a password: give it" in no_password.stderr
    wrong = run("read", str(ledger), "--etcd", etcd, "--password", "nope")
    assert wrong.returncode == 1 and f"wrong password for ledger {ledger}" in wrong.stderr

    from octavo.meta.errors import NoSuchLedgerError, NotEnoughBookiesError

    with SyncClient(etcd, "octavo") as client:
        with pytest.raises(NotEnoughBookiesError, match=r"in cluster 'octavo', which has nothing in etcd"):
            client.create_ledger(3, 3, 2)
        with pytest.raises(NoSuchLedgerError, match=rf"ledger {ledger} does not exist in cluster 'octavo'"):
            client.open_ledger(ledger)

    forced = subprocess.run([*octavo, "bookie", "readonly", "--bookie", "bookie-1", "--etcd", etcd],
                            capture_output=True, text=True, timeout=60)
    try:
        assert forced.returncode == 0 and forced.stdout.count("read-only") == 1, forced.stdout
        status = subprocess.run([*octavo, "bookie", "status", "--bookie", "bookie-1", "--etcd", etcd],
                                capture_output=True, text=True, timeout=60)
        mode = next(line for line in status.stdout.splitlines() if line.startswith("mode"))
        assert mode.count("read-only") == 1 and "read_only" not in mode, mode
        whole = subprocess.run([*octavo, "cluster", "status", "--etcd", etcd], capture_output=True, text=True,
                               timeout=60)
        row = next(line for line in whole.stdout.splitlines() if line.startswith("bookie-1"))
        assert "read-only forced by `octavo bookie readonly`; its own mark" in row, whole.stdout
    finally:
        subprocess.run([*octavo, "bookie", "writable", "--bookie", "bookie-1", "--etcd", etcd], capture_output=True,
                       timeout=60)
