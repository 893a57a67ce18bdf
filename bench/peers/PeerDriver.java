// The load driver of bench/peers/run.py for Apache Kafka and Apache BookKeeper: one JVM per system, kept for the
// whole benchmark (its JIT warms up once), reading one command per line on stdin and printing one JSON line per
// command on stdout. It runs the workloads of bench/cluster_bench.py the way that script drives Octavo:
//
//   throughput SIZE LEDGERS SECONDS ACK_QUORUM
//       Every ledger (Kafka: partition of a fresh topic) writes CHUNK entries, waits for all of their
//       acknowledgements, and again, until SECONDS have passed; CHUNK = max(1, min(8 MiB / SIZE) / LEDGERS), the
//       same in-flight budget as Octavo's client. Prints {"rate": entries/s, "entries": n, "seconds": s}.
//       The topic (ledgers) is deleted afterwards, as Octavo's ledgers and JetStream's stream are.
//   latency RATE SECONDS ACK_QUORUM
//       Open loop: entry i of 1 KiB is sent at t0 + i / RATE, one record per call, on one ledger (partition);
//       its latency runs from that scheduled time to its acknowledgement, in microseconds.
//       Prints {"latencies_us": [...], "late": n}.
//   catchup SIZE BYTES ACK_QUORUM
//       BYTES written in SIZE entries to one ledger (partition) with the same in-flight budget, then read back
//       from the start by a reader (Kafka: a consumer assigned to the partition; BookKeeper: the closed ledger
//       opened again, 8 reads of up to 1,000 entries and 8 MiB in all in flight). Prints {"write_rate", "read_rate", "entries"}.
//   tail RATE SECONDS ACK_QUORUM
//       The latency schedule above, and a tailing reader of the same ledger (Kafka: a consumer at the end of the
//       partition, fetch.min.bytes=1; BookKeeper: another client polling tryReadLastAddConfirmed every 0.2 ms
//       and reading up to it): microseconds from an entry's scheduled send to the reader holding it. Prints {"tail_us": [...], "latencies_us": [...], "late": n}.
//   quit
//
// Usage: java -cp CLASSPATH PeerDriver kafka BOOTSTRAP | bookkeeper METADATA_SERVICE_URI
// ACK_QUORUM is ignored by Kafka (acks=all waits for every in-sync replica; min.insync.replicas=2 is set on the
// topic).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;

import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LedgerEntries;
import org.apache.bookkeeper.client.api.LedgerEntry;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class PeerDriver {
    static final int INFLIGHT_BYTES = 8 * 1024 * 1024;  // bench/cluster_bench.py's INFLIGHT_BYTES
    static final int LATENCY_ENTRY_BYTES = 1024;
    static final int ACK_TIMEOUT_S = 120;  // Kafka's delivery.timeout.ms
    // -Dpeers.kafka.prime=false: no acknowledged record per partition before the clock starts (see prepare).
    static final boolean PRIME_PARTITIONS = Boolean.parseBoolean(System.getProperty("peers.kafka.prime", "true"));
    static final double BUFFER_FACTOR = Double.parseDouble(System.getProperty("peers.kafka.bufferFactor", "2"));

    /** One system under load: send entry `payload` to ledger `ledger`; `done` runs on acknowledgement. */
    interface Target extends AutoCloseable {
        void prepare(int ledgers, int ackQuorum, boolean latency) throws Exception;
        void send(int ledger, byte[] payload, Runnable done) throws Exception;
        void cleanup() throws Exception;
        /** Reads the `count` entries of ledger 0 from the start (the writing is over); returns their bytes. */
        long readAll(long count) throws Exception;
        /** Follows ledger 0 from its end, calling `got` with each entry's payload, until `stop` is set. */
        void follow(java.util.function.Consumer<byte[]> got, java.util.concurrent.atomic.AtomicBoolean stop)
            throws Exception;
        /** Makes what was written visible to a follower (BookKeeper: the LAC of the last entry). */
        default void flush(byte[] payload) throws Exception {}
    }

    static final AtomicReference<Throwable> FAILURE = new AtomicReference<>();

    static void fail(Throwable t) {
        FAILURE.compareAndSet(null, t);
    }

    static void check() throws Exception {
        Throwable t = FAILURE.getAndSet(null);
        if (t != null) {
            throw new Exception("a write failed: " + t, t);
        }
    }

    // -- Kafka ------------------------------------------------------------------------------------------------
    static final class KafkaTarget implements Target {
        final String bootstrap;
        final Admin admin;
        KafkaProducer<byte[], byte[]> producer;
        String topic;
        int run;

        KafkaTarget(String bootstrap) {
            this.bootstrap = bootstrap;
            Properties p = new Properties();
            p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            admin = Admin.create(p);
        }

        public void prepare(int ledgers, int ackQuorum, boolean latency) throws Exception {
            topic = "bench-" + ProcessHandle.current().pid() + "-" + (run++);
            NewTopic t = new NewTopic(topic, ledgers, (short) 3).configs(Map.of("min.insync.replicas", "2"));
            // A topic of 1,000 partitions (workload 4) takes its controller far longer than one of 100.
            long waitS = 60 + ledgers / 5;
            admin.createTopics(List.of(t)).all().get(waitS, TimeUnit.SECONDS);
            Properties p = new Properties();
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.ACKS_CONFIG, "all");
            // Kafka 4.x's default linger is 5 ms: kept for throughput, 0 for one-record latency.
            p.put(ProducerConfig.LINGER_MS_CONFIG, latency ? "0" : "5");
            // The in-flight budget is the 8 MiB of payload the workload keeps outstanding (as for Octavo); the
            // buffer holds it with its record framing and part-filled batches (BUFFER_FACTOR, see run.py).
            p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf((long) (INFLIGHT_BYTES * BUFFER_FACTOR)));
            p.put(ProducerConfig.BATCH_SIZE_CONFIG,
                  String.valueOf(Math.max(16384, Math.min(1 << 20, INFLIGHT_BYTES / ledgers))));
            p.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, String.valueOf(INFLIGHT_BYTES));
            p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
            // Not idempotent: on this loaded machine the idempotent producer (the default) got stuck in
            // OutOfOrderSequenceException retries on 100 partitions; acks=all is what makes a write durable.
            p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
            producer = new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
            // Every partition has a leader before the clock starts.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(waitS);
            while (true) {
                List<PartitionInfo> parts = producer.partitionsFor(topic);
                if (parts.size() == ledgers && parts.stream().allMatch(x -> x.leader() != null
                        && x.inSyncReplicas().length == 3)) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    throw new Exception("topic " + topic + " has no leaders after " + waitS + " s");
                }
                Thread.sleep(100);
            }
            // One acknowledged record per partition before the clock starts: a broker learns of its new
            // leaderships from the metadata log a little after the controller says so, and the first sends
            // would otherwise measure that (NOT_LEADER_OR_FOLLOWER, retries with backoff), not the writes.
            // Octavo's and BookKeeper's ledgers are likewise ready when their creation returns.
            List<java.util.concurrent.Future<?>> primed = new ArrayList<>();
            for (int i = 0; i < (PRIME_PARTITIONS ? ledgers : 0); i++) {
                primed.add(producer.send(new ProducerRecord<>(topic, i, null, new byte[1])));
            }
            for (java.util.concurrent.Future<?> f : primed) {
                f.get(120, TimeUnit.SECONDS);
            }
        }

        public void send(int ledger, byte[] payload, Runnable done) {
            producer.send(new ProducerRecord<>(topic, ledger, null, payload), (md, e) -> {
                if (e != null) {
                    fail(e);
                }
                done.run();
            });
        }

        KafkaConsumer<byte[], byte[]> consumer(TopicPartition tp) {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.FETCH_MIN_BYTES_CONFIG, "1");
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "10000");
            p.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, String.valueOf(INFLIGHT_BYTES));
            KafkaConsumer<byte[], byte[]> c =
                new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
            c.assign(List.of(tp));
            return c;
        }

        public long readAll(long count) {
            TopicPartition tp = new TopicPartition(topic, 0);
            long bytes = 0;
            long seen = 0;
            try (KafkaConsumer<byte[], byte[]> c = consumer(tp)) {
                c.seekToBeginning(List.of(tp));
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(600);
                // The priming record (prepare) comes first: count + 1 records.
                while (seen < count + (PRIME_PARTITIONS ? 1 : 0) && System.nanoTime() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(java.time.Duration.ofMillis(500))) {
                        seen++;
                        bytes += r.value().length;
                    }
                }
            }
            return bytes - (PRIME_PARTITIONS ? 1 : 0);
        }

        public void follow(java.util.function.Consumer<byte[]> got, java.util.concurrent.atomic.AtomicBoolean stop) {
            TopicPartition tp = new TopicPartition(topic, 0);
            try (KafkaConsumer<byte[], byte[]> c = consumer(tp)) {
                c.seekToEnd(List.of(tp));
                c.position(tp);
                synchronized (this) {
                    following = true;
                    notifyAll();
                }
                while (!stop.get()) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(java.time.Duration.ofMillis(100))) {
                        got.accept(r.value());
                    }
                }
            }
        }

        boolean following;

        public void cleanup() throws Exception {
            following = false;
            producer.close(java.time.Duration.ofSeconds(30));
            admin.deleteTopics(List.of(topic)).all().get(300, TimeUnit.SECONDS);
        }

        public void close() {
            admin.close();
        }
    }

    // -- BookKeeper -------------------------------------------------------------------------------------------
    static final class BookKeeperTarget implements Target {
        final BookKeeper bk;
        final String uri;
        BookKeeper tailClient;  // the tailing reader's own client
        final byte[] password = "bench".getBytes();
        List<LedgerHandle> handles = new ArrayList<>();

        BookKeeperTarget(String metadataServiceUri) throws Exception {
            ClientConfiguration conf = new ClientConfiguration();
            conf.setMetadataServiceUri(metadataServiceUri);
            conf.setUseV2WireProtocol(true);  // as Pulsar's brokers run it
            conf.setThrottleValue(0);  // no client-side rate limit: the in-flight budget is the only limit
            conf.setAddEntryTimeout(60);
            bk = new BookKeeper(conf);
            uri = metadataServiceUri;
        }

        public long readAll(long count) throws Exception {
            LedgerHandle w = handles.get(0);
            w.close();  // a closed ledger: every entry is readable, as Octavo's catch-up reads a closed ledger
            long bytes = 0;
            try (ReadHandle r = bk.newOpenLedgerOp().withLedgerId(w.getId()).withPassword(password)
                    .withDigestType(org.apache.bookkeeper.client.api.DigestType.CRC32C).withRecovery(false)
                    .execute().get(60, TimeUnit.SECONDS)) {
                java.util.ArrayDeque<java.util.concurrent.CompletableFuture<LedgerEntries>> inflight =
                    new java.util.ArrayDeque<>();
                long next = 0;
                long last = count - 1;
                // 8 reads in flight, 8 MiB of payload in all (the run of 2026-11-26 08:18 read 8 x 1,000 entries
                // of 64 KiB, 500 MiB at once, and the bookies timed out).
                int size = (int) (handles.get(0).getLength() / count);
                long perRead = Math.max(1, Math.min(1000, INFLIGHT_BYTES / 8 / Math.max(1, size)));
                while (next <= last || !inflight.isEmpty()) {
                    while (next <= last && inflight.size() < 8) {
                        long end = Math.min(last, next + perRead - 1);
                        inflight.add(r.readAsync(next, end));
                        next = end + 1;
                    }
                    try (LedgerEntries es = inflight.poll().get(120, TimeUnit.SECONDS)) {
                        for (LedgerEntry e : es) {
                            bytes += e.getEntryBuffer().readableBytes();
                        }
                    }
                }
            }
            return bytes;
        }

        public void follow(java.util.function.Consumer<byte[]> got, java.util.concurrent.atomic.AtomicBoolean stop)
                throws Exception {
            if (tailClient == null) {
                ClientConfiguration conf = new ClientConfiguration();
                conf.setMetadataServiceUri(uri);
                conf.setUseV2WireProtocol(true);
                tailClient = new BookKeeper(conf);
            }
            long id = handles.get(0).getId();
            try (ReadHandle r = tailClient.newOpenLedgerOp().withLedgerId(id).withPassword(password)
                    .withDigestType(org.apache.bookkeeper.client.api.DigestType.CRC32C).withRecovery(false)
                    .execute().get(60, TimeUnit.SECONDS)) {
                long next = 0;
                while (!stop.get()) {
                    // The LAC as the first bookie to answer has it, polled (a long poll by
                    // readLastAddConfirmedAndEntry fell seconds behind at 2,000/s here).
                    long lac = r.tryReadLastAddConfirmed();
                    if (lac < next) {
                        LockSupport.parkNanos(200_000);
                        continue;
                    }
                    try (LedgerEntries es = r.readUnconfirmed(next, lac)) {
                        for (LedgerEntry e : es) {
                            got.accept(e.getEntryBytes());
                        }
                    }
                    next = lac + 1;
                }
            }
        }

        public void flush(byte[] payload) throws Exception {
            handles.get(0).addEntry(payload);  // its add carries the LAC of the entries before it
        }

        public void prepare(int ledgers, int ackQuorum, boolean latency) throws Exception {
            handles = new ArrayList<>();
            for (int i = 0; i < ledgers; i++) {
                handles.add(bk.createLedger(3, 3, ackQuorum, BookKeeper.DigestType.CRC32C, password));
            }
        }

        public void send(int ledger, byte[] payload, Runnable done) {
            handles.get(ledger).asyncAddEntry(payload, (rc, lh, entryId, ctx) -> {
                if (rc != 0) {
                    fail(new Exception("addEntry rc=" + rc));
                }
                done.run();
            }, null);
        }

        public void cleanup() throws Exception {
            for (LedgerHandle h : handles) {
                if (!h.isClosed()) {
                    h.close();
                }
                bk.deleteLedger(h.getId());
            }
        }

        public void close() throws Exception {
            if (tailClient != null) {
                tailClient.close();
            }
            bk.close();
        }
    }

    // -- workloads --------------------------------------------------------------------------------------------
    static String throughput(Target target, int size, int ledgers, double seconds, int ackQuorum) throws Exception {
        target.prepare(ledgers, ackQuorum, false);
        try {
            return throughputRun(target, size, ledgers, seconds);
        } finally {
            FAILURE.set(null);
            target.cleanup();
        }
    }

    static String throughputRun(Target target, int size, int ledgers, double seconds) throws Exception {
        byte[] payload = new byte[size];
        new Random().nextBytes(payload);
        int chunk = Math.max(1, Math.max(1, Math.min(INFLIGHT_BYTES, INFLIGHT_BYTES / size)) / ledgers);
        // A ledger whose chunk is all acknowledged is queued here; this thread sends its next chunk (sending
        // from the client's callback thread could block it on the client's own buffer).
        BlockingQueue<Integer> ready = new ArrayBlockingQueue<>(ledgers);
        AtomicInteger[] pending = new AtomicInteger[ledgers];
        long[] done = new long[ledgers];
        long t0 = System.nanoTime();
        long deadline = t0 + (long) (seconds * 1e9);
        for (int i = 0; i < ledgers; i++) {
            pending[i] = new AtomicInteger();
            ready.add(i);
        }
        int active = ledgers;
        while (active > 0) {
            Integer ledger = ready.poll(ACK_TIMEOUT_S, TimeUnit.SECONDS);
            check();
            if (ledger == null) {
                long outstanding = 0;
                for (AtomicInteger x : pending) {
                    outstanding += x.get();
                }
                throw new Exception("no ledger's chunk acknowledged in " + ACK_TIMEOUT_S + " s (" + outstanding + " entries outstanding)");
            }
            if (System.nanoTime() >= deadline) {
                active--;
                continue;
            }
            int l = ledger;
            pending[l].set(chunk);
            for (int j = 0; j < chunk; j++) {
                target.send(l, payload, () -> {
                    if (pending[l].decrementAndGet() == 0) {
                        done[l] += chunk;
                        ready.add(l);
                    }
                });
            }
        }
        double elapsed = (System.nanoTime() - t0) / 1e9;
        long entries = 0;
        for (long d : done) {
            entries += d;
        }
        return String.format("{\"rate\": %.1f, \"entries\": %d, \"seconds\": %.3f}", entries / elapsed, entries,
                             elapsed);
    }

    /** Writes `count` entries of `size` to ledger 0, the in-flight budget as throughputRun; returns seconds. */
    static double writeCount(Target target, int size, long count) throws Exception {
        byte[] payload = new byte[size];
        new Random().nextBytes(payload);
        int chunk = Math.max(1, Math.min(INFLIGHT_BYTES, INFLIGHT_BYTES / size));
        long t0 = System.nanoTime();
        long written = 0;
        while (written < count) {
            int n = (int) Math.min(chunk, count - written);
            java.util.concurrent.CountDownLatch acked = new java.util.concurrent.CountDownLatch(n);
            for (int j = 0; j < n; j++) {
                target.send(0, payload, acked::countDown);
            }
            if (!acked.await(ACK_TIMEOUT_S, TimeUnit.SECONDS)) {
                throw new Exception("a chunk not acknowledged in " + ACK_TIMEOUT_S + " s");
            }
            check();
            written += n;
        }
        return (System.nanoTime() - t0) / 1e9;
    }

    static String catchup(Target target, int size, long totalBytes, int ackQuorum) throws Exception {
        target.prepare(1, ackQuorum, false);
        try {
            long count = Math.max(1, totalBytes / size);
            double writeS = writeCount(target, size, count);
            long t0 = System.nanoTime();
            long bytes = target.readAll(count);
            double readS = (System.nanoTime() - t0) / 1e9;
            if (bytes != count * size) {
                throw new Exception("read " + bytes + " bytes, wrote " + count * size);
            }
            return String.format("{\"write_rate\": %.1f, \"read_rate\": %.1f, \"entries\": %d, "
                                 + "\"read_seconds\": %.3f}", count / writeS, count / readS, count, readS);
        } finally {
            FAILURE.set(null);
            target.cleanup();
        }
    }

    static String tail(Target target, int rate, double seconds, int ackQuorum) throws Exception {
        target.prepare(1, ackQuorum, true);
        int n = (int) (rate * seconds);
        long[] scheduledAt = new long[n];
        long[] tailUs = new long[n];
        java.util.Arrays.fill(tailUs, -1);
        AtomicInteger received = new AtomicInteger();
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        AtomicReference<Throwable> readerFailure = new AtomicReference<>();
        java.util.concurrent.CountDownLatch started = new java.util.concurrent.CountDownLatch(1);
        Thread reader = new Thread(() -> {
            try {
                started.countDown();
                target.follow(payload -> {
                    long now = System.nanoTime();
                    if (payload.length < 8) {
                        return;  // Kafka's priming record
                    }
                    long i = java.nio.ByteBuffer.wrap(payload).getLong();
                    if (i >= 0 && i < n && tailUs[(int) i] < 0) {
                        tailUs[(int) i] = (now - scheduledAt[(int) i]) / 1000;
                        received.incrementAndGet();
                    }
                }, stop);
            } catch (Throwable t) {
                readerFailure.set(t);
            }
        }, "tail-reader");
        try {
            reader.start();
            started.await();
            if (target instanceof KafkaTarget) {
                KafkaTarget k = (KafkaTarget) target;
                synchronized (k) {
                    while (!k.following && readerFailure.get() == null) {
                        k.wait(100);
                    }
                }
            }
            String add = latencyRun(target, rate, seconds, (i, scheduled) -> scheduledAt[i] = scheduled);
            byte[] filler = new byte[LATENCY_ENTRY_BYTES];
            java.nio.ByteBuffer.wrap(filler).putLong(-1L);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(ACK_TIMEOUT_S);
            while (received.get() < n && readerFailure.get() == null && System.nanoTime() < deadline) {
                target.flush(filler);
                Thread.sleep(10);
            }
            if (readerFailure.get() != null) {
                throw new Exception("the tailing reader failed: " + readerFailure.get(), readerFailure.get());
            }
            if (received.get() < n) {
                throw new Exception("the tailing reader got " + received.get() + " of " + n + " entries");
            }
            StringBuilder out = new StringBuilder("{\"tail_us\": [");
            for (int i = 0; i < n; i++) {
                out.append(i == 0 ? "" : ",").append(tailUs[i]);
            }
            return out.append("], ").append(add.substring(1)).toString();
        } finally {
            stop.set(true);
            reader.join(30_000);
            FAILURE.set(null);
            target.cleanup();
        }
    }

    interface OnSend {
        void sent(int index, long scheduledNanos);
    }

    static String latency(Target target, int rate, double seconds, int ackQuorum) throws Exception {
        target.prepare(1, ackQuorum, true);
        try {
            return latencyRun(target, rate, seconds, null);
        } finally {
            FAILURE.set(null);
            target.cleanup();
        }
    }

    static String latencyRun(Target target, int rate, double seconds, OnSend onSend) throws Exception {
        byte[] template = new byte[LATENCY_ENTRY_BYTES];
        new Random().nextBytes(template);
        int n = (int) (rate * seconds);
        long[] latencies = new long[n];
        AtomicInteger outstanding = new AtomicInteger(n);
        int late = 0;
        long t0 = System.nanoTime() + 1_000_000;
        for (int i = 0; i < n; i++) {
            long scheduled = t0 + (long) (i * 1e9 / rate);
            long wait = scheduled - System.nanoTime();
            if (wait > 50_000) {
                LockSupport.parkNanos(wait - 50_000);
            }
            while (System.nanoTime() < scheduled) {
                Thread.onSpinWait();
            }
            if (System.nanoTime() - scheduled > 1_000_000) {
                late++;  // the sender itself fell behind the schedule by more than 1 ms
            }
            int idx = i;
            // Each entry carries its index in its first 8 bytes (a tailing reader finds its schedule by it).
            byte[] payload = template.clone();
            java.nio.ByteBuffer.wrap(payload).putLong(i);
            if (onSend != null) {
                onSend.sent(i, scheduled);
            }
            target.send(0, payload, () -> {
                latencies[idx] = (System.nanoTime() - scheduled) / 1000;
                outstanding.decrementAndGet();
            });
            check();
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(ACK_TIMEOUT_S);
        while (outstanding.get() > 0) {
            check();
            if (System.nanoTime() > deadline) {
                throw new Exception(outstanding.get() + " entries unacknowledged after " + ACK_TIMEOUT_S + " s");
            }
            Thread.sleep(1);
        }
        StringBuilder out = new StringBuilder("{\"late\": ").append(late).append(", \"latencies_us\": [");
        for (int i = 0; i < n; i++) {
            out.append(i == 0 ? "" : ",").append(latencies[i]);
        }
        return out.append("]}").toString();
    }

    public static void main(String[] args) throws Exception {
        // Results go to the real stdout; the clients' console logging (captured when their loggers start) to
        // stderr.
        java.io.PrintStream out =
            new java.io.PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true);
        System.setOut(System.err);
        Target target = args[0].equals("kafka") ? new KafkaTarget(args[1]) : new BookKeeperTarget(args[1]);
        out.println("{\"ready\": true}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            String result;
            try {
                switch (w[0]) {
                    case "throughput":
                        result = throughput(target, Integer.parseInt(w[1]), Integer.parseInt(w[2]),
                                         Double.parseDouble(w[3]), Integer.parseInt(w[4]));
                        break;
                    case "latency":
                        result = latency(target, Integer.parseInt(w[1]), Double.parseDouble(w[2]),
                                      Integer.parseInt(w[3]));
                        break;
                    case "catchup":
                        result = catchup(target, Integer.parseInt(w[1]), Long.parseLong(w[2]),
                                         Integer.parseInt(w[3]));
                        break;
                    case "tail":
                        result = tail(target, Integer.parseInt(w[1]), Double.parseDouble(w[2]),
                                      Integer.parseInt(w[3]));
                        break;
                    case "quit":
                        target.close();
                        System.exit(0);
                        return;
                    default:
                        result = "{\"error\": \"unknown command " + w[0] + "\"}";
                }
            } catch (Exception e) {
                result = "{\"error\": \"" + e.toString().replace("\\", "/").replace("\"", "'") + "\"}";
            }
            out.println(result);
        }
        target.close();
    }
}
