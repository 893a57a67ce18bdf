"""etcd with authentication on (a real etcd, users and roles made with etcdctl): a bookie without credentials
is refused with a message that says so; with a user and its password file it registers, and a client with its
own user writes and reads; a wrong password is named; an expired token is replaced without the caller
noticing; the password never shows in the bookie's log."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import EtcdProcess, etcd_binary
from octavo.client import Client, ClientOptions
from octavo.meta.errors import MetadataUnavailableError
from octavo.node.testing import BookieProcess

PASSWORD = "bookie-secret-pw"


def etcdctl(endpoint: str, *args: str, user: str = "") -> None:
    command = [os.path.join(os.path.dirname(etcd_binary()), "etcdctl"), "--endpoints", endpoint,
               *(["--user", user] if user else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    # Tokens expire after 2 s idle: long enough for a call, short enough to see one expire.
    proc = EtcdProcess(str(tmp_path_factory.mktemp("etcd-auth") / "data"), extra_args=["--auth-token-ttl", "2"])
    proc.start()
    endpoint = proc.endpoint
    etcdctl(endpoint, "user", "add", "root", "--new-user-password=root-pw")
    etcdctl(endpoint, "user", "grant-role", "root", "root")
    etcdctl(endpoint, "role", "add", "octavo-rw")
    etcdctl(endpoint, "role", "grant-permission", "octavo-rw", "--prefix=true", "readwrite", "/octavo/")
    for user in ("octavo-bookie", "octavo-writer"):
        etcdctl(endpoint, "user", "add", user, f"--new-user-password={PASSWORD}")
        etcdctl(endpoint, "user", "grant-role", user, "octavo-rw")
    etcdctl(endpoint, "auth", "enable")
    yield proc
    proc.stop()


def node(etcd: EtcdProcess, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(data_dir), "--port",
                           "0", "--etcd", etcd.endpoint, *args], capture_output=True, text=True, timeout=60)


def test_a_bookie_without_credentials_is_refused_with_a_clear_message(auth_etcd: EtcdProcess,
                                                                      tmp_path: Path) -> None:
    done = node(auth_etcd, tmp_path / "b")
    assert done.returncode == 1
    assert "etcd refuses this client: give it credentials" in done.stderr, done.stderr


def test_a_wrong_password_is_named(auth_etcd: EtcdProcess, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    done = node(auth_etcd, tmp_path / "b", "--etcd-username", "octavo-bookie", "--etcd-password-file", str(wrong))
    assert done.returncode == 1 and "authentication of user 'octavo-bookie' failed" in done.stderr, done.stderr
    assert "not-the-password" not in done.stderr


async def test_bookies_and_clients_with_credentials_work_and_expired_tokens_are_renewed(
        auth_etcd: EtcdProcess, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    bookies = [BookieProcess(str(tmp_path / f"b{i}"), args=[
        "--etcd", auth_etcd.endpoint, "--bookie-id", f"b{i}", "--etcd-username", "octavo-bookie",
        "--etcd-password-file", str(secret), "--registration-ttl-s", "3"]) for i in range(3)]
    try:
        for b in bookies:
            b.start()
        options = ClientOptions(etcd_username="octavo-writer", etcd_password_file=str(secret),
                                metadata_timeout_s=3.0)
        async with Client(auth_etcd.endpoint, options=options) as client:
            for _ in range(50):  # the bookies register as their lease allows
                if len(await client.bookies(refresh=True)) == 3:
                    break
                await asyncio.sleep(0.1)
            writer = await client.create_ledger(3, 3, 2, password=b"pw")
            await writer.append_many([b"x" * 100] * 10)
            await asyncio.sleep(3)  # the client's token expires while it is idle
            await writer.close()  # an etcd update: a new token was taken
            reader = await client.open_ledger(writer.ledger_id, password=b"pw")
            assert [e.data async for e in reader.read(0, 9)] == [b"x" * 100] * 10
        for b in bookies:
            assert b.alive() and PASSWORD not in b.log_tail(200)
    finally:
        for b in bookies:
            b.stop()


async def test_a_client_without_credentials_gets_the_reason(auth_etcd: EtcdProcess) -> None:
    async with Client(auth_etcd.endpoint, options=ClientOptions(metadata_timeout_s=2.0)) as client:
        with pytest.raises(MetadataUnavailableError, match="give it credentials"):
            await client.list_ledgers()


async def test_a_user_limited_to_the_prefix_watches_deletes_and_compacts(auth_etcd: EtcdProcess) -> None:
    """What a bookie's etcd user needs beyond its keys: the deletion watch's start revision and the auditor's
    compaction, both with only the octavo-rw role."""
    from octavo.meta.etcd import EtcdAuth, EtcdClient
    from octavo.meta.keyrange import WatchPosition

    auth = EtcdAuth(username="octavo-bookie", password=PASSWORD)
    async with EtcdClient(auth_etcd.endpoint, auth=auth) as etcd:
        await etcd.put(b"/octavo/auth-watch/a", b"v")
        position = WatchPosition()
        watch = etcd.watch_deletes(b"/octavo/auth-watch/", position)
        first = asyncio.ensure_future(asyncio.wait_for(watch.__anext__(), 10))
        await asyncio.sleep(0.5)
        await etcd.delete(b"/octavo/auth-watch/a")
        assert await first == [b"/octavo/auth-watch/a"]
        await watch.aclose()
        assert position.revision > 0
        revision = await etcd.revision()
        assert await etcd.compact(revision) is True
        assert (await etcd.status()).revision >= revision
