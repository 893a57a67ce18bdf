"""The load driver of bench/peers/run.py for NATS JetStream: the commands of PeerDriver.java (one per line on
stdin, one JSON line on stdout), over the NATS client protocol spoken directly on an asyncio connection.

No client library: the protocol is a few text lines (CONNECT, SUB, PUB with a reply subject, MSG and HMSG back),
and JetStream's API is requests on `$JS.API.*` subjects with JSON bodies, so the benchmark needs nothing but
Debian's nats-server (nats-py is not in the test environment). A publish is acknowledged by the stream's
leader once the stream's Raft group (3 replicas) has it on a majority: JetStream's own "ack quorum" of 2, its
files written without fsync (nats-server syncs them every 2 minutes by default).

    throughput SIZE LEDGERS SECONDS ACK_QUORUM   ledgers are subjects of one R3 file stream
    latency RATE SECONDS ACK_QUORUM              open loop, us from the scheduled send to the publish ack
    catchup SIZE BYTES ACK_QUORUM                BYTES written in SIZE entries, then read back from the start by
                                                 a pull consumer: {"write_rate", "read_rate", "entries"}
    tail RATE SECONDS ACK_QUORUM                 open loop of 1 KiB, a push consumer following the subject:
                                                 us from the scheduled send to the entry's delivery
    quit

ACK_QUORUM is ignored (a Raft majority). Usage: python jsdriver.py nats://127.0.0.1:PORT[,nats://...]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

INFLIGHT_BYTES = 8 * 1024 * 1024  # bench/cluster_bench.py's INFLIGHT_BYTES
LATENCY_ENTRY_BYTES = 1024
STREAM = "BENCH"
ACK_TIMEOUT_S = 120.0
PULL_BATCH = 2000

Handler = Callable[[str, str, bytes, bytes], None]  # subject, reply, headers, payload


class Nats:
    """One connection: publishes, subscriptions by sid, and requests answered on an inbox."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.sids = 0
        self.inbox = f"_INBOX.{os.urandom(6).hex()}"
        self.requests: dict[str, asyncio.Future[bytes]] = {}
        self.next_request = 0

    async def connect(self, url: str) -> None:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        self.reader, self.writer = await asyncio.open_connection(host, int(port), limit=1 << 24)
        await self.reader.readuntil(b"\r\n")  # INFO
        self.writer.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                          b'"protocol":1}\r\n')
        self.reading = asyncio.create_task(self._read())
        self.subscribe(self.inbox + ".*", self._answer)

    def subscribe(self, subject: str, handler: Handler) -> str:
        self.sids += 1
        sid = str(self.sids)
        self.handlers[sid] = handler
        self.writer.write(f"SUB {subject} {sid}\r\n".encode())
        return sid

    def unsubscribe(self, sid: str) -> None:
        self.handlers.pop(sid, None)
        self.writer.write(f"UNSUB {sid}\r\n".encode())

    def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.writer.write(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(payload), payload))

    async def request(self, subject: str, body: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        self.next_request += 1
        token = f"{self.inbox}.r{self.next_request}"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.requests[token] = future
        self.publish(subject, json.dumps(body).encode() if body is not None else b"", token)
        try:
            answer = await asyncio.wait_for(future, timeout)
        finally:
            self.requests.pop(token, None)
        result: dict[str, Any] = json.loads(answer) if answer else {"error": {"description": "no responders"}}
        return result

    async def wait(self, future: asyncio.Future[None], timeout: float) -> None:
        """`future`, or the connection's end (nats-server closes a client that reads too slowly: "Slow
        Consumer"), or TimeoutError: a closed connection fails the run at once instead of after the timeout."""
        done, _ = await asyncio.wait({future, self.reading}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            return
        if self.reading in done:
            raise ConnectionError(f"the connection to nats-server ended: {self.reading.exception()!r}")
        raise TimeoutError(f"no answer in {timeout:.0f} s")

    def _answer(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        future = self.requests.get(subject)
        if future is not None and not future.done():
            future.set_result(payload if not headers or payload else b"")

    async def _read(self) -> None:
        buf = b""
        reader = self.reader
        while True:
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("nats-server closed the connection")
            buf += data
            pos = 0
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = buf[pos:eol]
                if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                    words = line.split()
                    total = int(words[-1])
                    end = eol + 2 + total
                    if len(buf) < end + 2:
                        break
                    body = buf[eol + 2:end]
                    if words[0] == b"HMSG":
                        head = int(words[-2])
                        headers, body = body[:head], body[head:]
                        reply = words[3].decode() if len(words) == 6 else ""
                    else:
                        headers = b""
                        reply = words[3].decode() if len(words) == 5 else ""
                    handler = self.handlers.get(words[2].decode())
                    if handler is not None:
                        handler(words[1].decode(), reply, headers, body)
                    pos = end + 2
                    continue
                if line == b"PING":
                    self.writer.write(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    print(f"nats-server: {line.decode()}", file=sys.stderr, flush=True)
                pos = eol + 2
            buf = buf[pos:]


class Acks:
    """Publishes with an ack each, counted per group; a failed ack is kept and raised by check()."""

    def __init__(self, nc: Nats) -> None:
        self.nc = nc
        self.prefix = f"_ACK.{os.urandom(6).hex()}"
        self.waiters: dict[str, Callable[[bytes], None]] = {}
        self.failure: str | None = None
        nc.subscribe(self.prefix + ".*", self._on_ack)
        self.count = 0

    def _on_ack(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        done = self.waiters.pop(subject, None)
        if headers and not payload:
            self.failure = self.failure or f"publish answered {headers[:60]!r}"
        elif payload.startswith(b'{"error"') or b'"error":' in payload[:40]:
            self.failure = self.failure or payload.decode()
        if done is not None:
            done(payload)

    def publish(self, subject: str, payload: bytes, done: Callable[[bytes], None]) -> None:
        self.count += 1
        token = f"{self.prefix}.{self.count}"
        self.waiters[token] = done
        self.nc.publish(subject, payload, token)

    def check(self) -> None:
        if self.nc.reading.done():
            raise ConnectionError(f"the connection to nats-server ended: {self.nc.reading.exception()!r}")
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise RuntimeError(f"a publish failed: {failure}")


class Driver:
    def __init__(self, nc: Nats) -> None:
        self.nc = nc
        self.acks = Acks(nc)
        self.run = 0

    async def create_stream(self) -> None:
        """The R3 file stream, once the cluster has a JetStream leader (it answers errors until then)."""
        config = {"name": STREAM, "subjects": ["bench.>"], "num_replicas": 3, "storage": "file",
                  "max_msg_size": INFLIGHT_BYTES, "discard": "old"}
        deadline = time.monotonic() + 120
        while True:
            try:
                answer = await self.nc.request(f"$JS.API.STREAM.CREATE.{STREAM}", config, timeout=10)
            except TimeoutError:
                answer = {"error": {"description": "timeout"}}
            if "error" not in answer:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no stream after 120 s: {answer['error']}")
            await asyncio.sleep(0.5)
        # A publish before the stream's Raft group has elected a leader is answered "no responders" (503).
        while True:
            info = await self.nc.request(f"$JS.API.STREAM.INFO.{STREAM}", None, timeout=10)
            if info.get("cluster", {}).get("leader"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stream has no leader after 120 s: {info}")
            await asyncio.sleep(0.2)

    async def purge(self) -> None:
        await self.nc.request(f"$JS.API.STREAM.PURGE.{STREAM}", {}, timeout=60)

    async def write_chunks(self, size: int, ledgers: int, seconds: float | None, total: int | None = None) -> int:
        """Every ledger (subject) publishes its chunk, waits for all its acks, and again; until `seconds`
        have passed or `total` entries are written. Returns the entries written."""
        self.run += 1
        payload = os.urandom(size)
        chunk = max(1, max(1, INFLIGHT_BYTES // size) // ledgers)
        loop = asyncio.get_running_loop()
        deadline = time.perf_counter() + seconds if seconds is not None else None
        written = [0] * ledgers
        left = [total if total is not None else -1]
        nc = self.nc

        async def one(i: int) -> None:
            subject = f"bench.r{self.run}.l{i}"
            while (deadline is None or time.perf_counter() < deadline) and left[0] != 0:
                n = chunk if left[0] < 0 else min(chunk, left[0])
                left[0] -= n if left[0] > 0 else 0
                future: asyncio.Future[None] = loop.create_future()
                outstanding = [n]

                def done(_: bytes, f: asyncio.Future[None] = future, o: list[int] = outstanding) -> None:
                    o[0] -= 1
                    if o[0] == 0 and not f.done():
                        f.set_result(None)

                for _ in range(n):
                    self.acks.publish(subject, payload, done)
                await nc.writer.drain()
                await nc.wait(future, ACK_TIMEOUT_S)
                self.acks.check()
                written[i] += n

        await asyncio.gather(*(one(i) for i in range(ledgers)))
        return sum(written)

    async def throughput(self, size: int, ledgers: int, seconds: float) -> dict[str, object]:
        t0 = time.perf_counter()
        entries = await self.write_chunks(size, ledgers, seconds)
        elapsed = time.perf_counter() - t0
        await self.purge()
        return {"rate": entries / elapsed, "entries": entries, "seconds": elapsed}

    async def open_loop(self, rate: int, seconds: float, subject: str,
                        on_send: Callable[[int, float], None] | None = None) -> tuple[list[int], int]:
        """Entry i (1 KiB, its index in the first 8 bytes) published at t0 + i / rate; returns each entry's
        latency from its scheduled time to its ack, in microseconds, and how many were sent over 1 ms late."""
        loop = asyncio.get_running_loop()
        n = int(rate * seconds)
        latencies = [0] * n
        body = os.urandom(LATENCY_ENTRY_BYTES - 8)
        outstanding = [n]
        all_done: asyncio.Future[None] = loop.create_future()
        late = 0
        t0 = time.perf_counter() + 0.001
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.001:
                late += 1

            def done(_: bytes, i: int = i, scheduled: float = scheduled) -> None:
                latencies[i] = int((time.perf_counter() - scheduled) * 1e6)
                outstanding[0] -= 1
                if outstanding[0] == 0 and not all_done.done():
                    all_done.set_result(None)

            if on_send is not None:
                on_send(i, scheduled)
            self.acks.publish(subject, i.to_bytes(8, "big") + body, done)
            self.acks.check()
        await self.nc.wait(all_done, ACK_TIMEOUT_S)
        self.acks.check()
        return latencies, late

    async def latency(self, rate: int, seconds: float) -> dict[str, object]:
        self.run += 1
        latencies, late = await self.open_loop(rate, seconds, f"bench.r{self.run}.lat")
        await self.purge()
        return {"latencies_us": latencies, "late": late}

    async def catchup(self, size: int, total_bytes: int) -> dict[str, object]:
        """`total_bytes` written in `size` entries, then all read back by a pull consumer (no acks)."""
        count = max(1, total_bytes // size)
        t0 = time.perf_counter()
        written = await self.write_chunks(size, 1, None, count)
        write_s = time.perf_counter() - t0
        subject = f"bench.r{self.run}.l0"
        name = f"CATCHUP{self.run}"
        answer = await self.nc.request(f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{name}", {
            "stream_name": STREAM, "config": {"durable_name": name, "deliver_policy": "all", "ack_policy": "none",
                                              "filter_subject": subject, "max_waiting": 16}})
        if "error" in answer:
            raise RuntimeError(f"consumer: {answer['error']}")
        loop = asyncio.get_running_loop()
        got = [0, 0]  # entries, bytes
        finished: asyncio.Future[None] = loop.create_future()
        inbox = f"_PULL.{os.urandom(6).hex()}"
        requested = [0]
        # Two batches outstanding, 8 MiB of payload in all: nats-server closes a client with more than 64 MiB
        # waiting to be sent to it (the run of 2026-11-26 08:18 asked for 2 x 2,000 entries of 64 KiB).
        per_pull = max(1, min(PULL_BATCH, INFLIGHT_BYTES // 2 // size))

        def pull() -> None:
            batch = min(per_pull, written - requested[0])
            if batch > 0:
                requested[0] += batch
                self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{name}",
                                json.dumps({"batch": batch}).encode(), inbox)

        def on_msg(subject: str, reply: str, headers: bytes, payload: bytes) -> None:
            if headers and not payload:
                return  # a status (408 request expired, 100 idle heartbeat)
            got[0] += 1
            got[1] += len(payload)
            if got[0] % per_pull == 0:
                pull()  # a batch is in: ask for the one after the next (two are kept outstanding)
            if got[0] == written and not finished.done():
                finished.set_result(None)

        t1 = time.perf_counter()
        sid = self.nc.subscribe(inbox, on_msg)
        pull()
        pull()
        await self.nc.wait(finished, 600)
        read_s = time.perf_counter() - t1
        self.nc.unsubscribe(sid)
        await self.nc.request(f"$JS.API.CONSUMER.DELETE.{STREAM}.{name}", {})
        await self.purge()
        if got[1] != written * size:
            raise RuntimeError(f"read {got[1]} bytes, wrote {written * size}")
        return {"write_rate": written / write_s, "read_rate": written / read_s, "entries": written,
                "read_seconds": read_s}

    async def tail(self, rate: int, seconds: float) -> dict[str, object]:
        """An open loop of 1 KiB publishes and a push consumer on the same subject (deliver new, no acks):
        latency from an entry's scheduled send to its delivery to the consumer."""
        self.run += 1
        subject = f"bench.r{self.run}.tail"
        deliver = f"_TAIL.{os.urandom(6).hex()}"
        n = int(rate * seconds)
        scheduled_at = [0.0] * n
        tail_us = [-1] * n
        received = [0]
        loop = asyncio.get_running_loop()
        all_in: asyncio.Future[None] = loop.create_future()

        def on_msg(subj: str, reply: str, headers: bytes, payload: bytes) -> None:
            if len(payload) < 8:
                return  # a status message
            i = int.from_bytes(payload[:8], "big")
            if 0 <= i < n and tail_us[i] < 0:
                tail_us[i] = int((time.perf_counter() - scheduled_at[i]) * 1e6)
                received[0] += 1
                if received[0] == n and not all_in.done():
                    all_in.set_result(None)

        sid = self.nc.subscribe(deliver, on_msg)
        answer = await self.nc.request(f"$JS.API.CONSUMER.CREATE.{STREAM}", {
            "stream_name": STREAM, "config": {"deliver_subject": deliver, "deliver_policy": "new",
                                              "ack_policy": "none", "filter_subject": subject}})
        if "error" in answer:
            raise RuntimeError(f"consumer: {answer['error']}")

        def on_send(i: int, scheduled: float) -> None:
            scheduled_at[i] = scheduled

        add_us, late = await self.open_loop(rate, seconds, subject, on_send)
        await self.nc.wait(all_in, ACK_TIMEOUT_S)
        self.nc.unsubscribe(sid)
        await self.nc.request(f"$JS.API.CONSUMER.DELETE.{STREAM}.{answer['name']}", {})
        await self.purge()
        return {"tail_us": tail_us, "latencies_us": add_us, "late": late}


async def main(url: str) -> None:
    nc = Nats()
    await nc.connect(url.split(",")[0])
    driver = Driver(nc)
    await driver.create_stream()
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        words = line.split()
        if not words or words[0] == "quit":
            return
        try:
            if words[0] == "throughput":
                result = await driver.throughput(int(words[1]), int(words[2]), float(words[3]))
            elif words[0] == "latency":
                result = await driver.latency(int(words[1]), float(words[2]))
            elif words[0] == "catchup":
                result = await driver.catchup(int(words[1]), int(words[2]))
            elif words[0] == "tail":
                result = await driver.tail(int(words[1]), float(words[2]))
            else:
                result = {"error": f"unknown command {words[0]}"}
        except Exception as e:  # reported to run.py, which records the run as failed and goes on
            driver.acks.failure = None
            result = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
