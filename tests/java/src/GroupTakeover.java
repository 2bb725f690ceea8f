// The official Java client (kafka-clients) in a consumer group against kaas,
// driven by tests/e2e/test_java_client.py.
//
// Usage: java GroupTakeover BOOTSTRAP TOPIC PARTITIONS GROUP PROTOCOL N
//   PROTOCOL is `classic` or `consumer` (KIP-848, group.protocol=consumer).
//
// 1. produce N records (values "0".."N-1", round-robin over the partitions,
//    acks=all, the default idempotent producer);
// 2. two consumers A and B join GROUP; each commits synchronously after
//    processing every poll's batch (at-least-once); wait until both own
//    partitions, disjoint, together all of them;
// 3. once about half the records are consumed, A closes (leaves the group);
//    B must take over every partition and consume the rest;
// 4. B closes; a fresh consumer C of the group reads the committed offsets
//    (they must equal the log end offsets), then N more records are produced
//    and C must get exactly those: the committed offsets resume with no loss
//    and no duplicate.
// No record may be lost. A record seen twice would be one A processed but had
// not committed when it left; A commits before every poll, so any duplicate
// is reported, and the test (which knows the pattern) asserts there are none.
//
// Prints `RESULT key=value ...` on success and exits 0; on a failed check it
// prints `FAIL <reason>` and exits 1 (2 for an exception).

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class GroupTakeover {
    static String bootstrap, topic, group, protocol;
    static int partitions, n;
    static final long DEADLINE_MS = 150_000;
    static final long start = System.currentTimeMillis();

    static final class Failed extends RuntimeException {
        Failed(String m) { super(m); }
    }

    static void check(boolean ok, String what) {
        if (!ok) throw new Failed(what);
    }

    static void log(String m) {
        System.out.printf("[%6d ms] %s%n", System.currentTimeMillis() - start, m);
        System.out.flush();
    }

    static void waitFor(java.util.function.BooleanSupplier p, long ms, String what) throws InterruptedException {
        long until = System.currentTimeMillis() + ms;
        while (!p.getAsBoolean()) {
            if (System.currentTimeMillis() > until) throw new Failed("timed out waiting for " + what);
            Thread.sleep(50);
        }
    }

    static void produce(int lo, int hi) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        p.put("delivery.timeout.ms", "60000");
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            List<java.util.concurrent.Future<?>> fs = new ArrayList<>();
            for (int i = lo; i < hi; i++) {
                fs.add(prod.send(new ProducerRecord<>(topic, i % partitions, null, Integer.toString(i))));
            }
            for (java.util.concurrent.Future<?> f : fs) f.get();
        }
        log("produced " + lo + ".." + (hi - 1));
    }

    static KafkaConsumer<String, String> consumer(String name) {
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("group.id", group);
        c.put("client.id", name);
        c.put("group.protocol", protocol);
        c.put("enable.auto.commit", "false");
        c.put("auto.offset.reset", "earliest");
        // Small batches so the group is still consuming when A leaves.
        c.put("max.poll.records", "20");
        c.put("fetch.max.wait.ms", "100");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        if (protocol.equals("classic")) {
            // The consumer protocol takes these from the broker instead (the
            // client refuses them with group.protocol=consumer).
            c.put("session.timeout.ms", "10000");
            c.put("heartbeat.interval.ms", "500");
        }
        return new KafkaConsumer<>(c);
    }

    /** A consumer on its own thread (KafkaConsumer is single-threaded). */
    static final class Member implements Runnable {
        final String name;
        final Map<Integer, AtomicInteger> seen;
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicReference<Set<Integer>> assigned = new AtomicReference<>(Set.of());
        final AtomicReference<Throwable> error = new AtomicReference<>();
        final AtomicInteger consumed = new AtomicInteger();
        final AtomicInteger throttleMs;
        final Thread thread;

        Member(String name, Map<Integer, AtomicInteger> seen, int throttleMs) {
            this.name = name;
            this.seen = seen;
            this.throttleMs = new AtomicInteger(throttleMs);
            this.thread = new Thread(this, name);
        }

        public void run() {
            try (KafkaConsumer<String, String> c = consumer(name)) {
                c.subscribe(List.of(topic));
                while (!stop.get()) {
                    ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(100));
                    Set<Integer> now = new TreeSet<>();
                    for (TopicPartition tp : c.assignment()) now.add(tp.partition());
                    assigned.set(now);
                    if (recs.isEmpty()) continue;
                    Map<TopicPartition, OffsetAndMetadata> offs = new HashMap<>();
                    for (ConsumerRecord<String, String> r : recs) {
                        seen.computeIfAbsent(Integer.parseInt(r.value()), k -> new AtomicInteger()).incrementAndGet();
                        offs.put(new TopicPartition(r.topic(), r.partition()),
                                new OffsetAndMetadata(r.offset() + 1, r.leaderEpoch(), "java"));
                    }
                    // Processed, now durable: commit before the next poll so a
                    // rebalance in that poll hands over no uncommitted work.
                    c.commitSync(offs, Duration.ofSeconds(30));
                    consumed.addAndGet(recs.count());
                    int t = throttleMs.get();
                    if (t > 0) Thread.sleep(t);
                }
                log(name + " closing (consumed " + consumed.get() + ", owned " + assigned.get() + ")");
            } catch (Throwable e) {
                error.set(e);
                log(name + " failed: " + e);
            }
            assigned.set(Set.of());
        }

        void check() {
            Throwable e = error.get();
            if (e != null) throw new Failed(name + " failed: " + e);
        }
    }

    static Set<Integer> all() {
        Set<Integer> s = new TreeSet<>();
        for (int p = 0; p < partitions; p++) s.add(p);
        return s;
    }

    static void run() throws Exception {
        produce(0, n);
        Map<Integer, AtomicInteger> seen = new ConcurrentHashMap<>();
        // Throttled so that A still has work when it leaves.
        Member a = new Member("A", seen, 50), b = new Member("B", seen, 50);
        a.thread.start();
        b.thread.start();
        waitFor(() -> {
            a.check();
            b.check();
            Set<Integer> sa = a.assigned.get(), sb = b.assigned.get();
            if (sa.isEmpty() || sb.isEmpty()) return false;
            Set<Integer> u = new TreeSet<>(sa);
            u.addAll(sb);
            Set<Integer> i = new HashSet<>(sa);
            i.retainAll(sb);
            return u.equals(all()) && i.isEmpty();
        }, 60_000, "A and B to split the partitions");
        log("split: A=" + a.assigned.get() + " B=" + b.assigned.get());
        waitFor(() -> { a.check(); b.check(); return seen.size() >= n / 2; }, 60_000, "half the records");
        check(seen.size() < n, "everything consumed before A left (" + seen.size() + ")");
        int aConsumed = a.consumed.get();
        a.stop.set(true);
        a.thread.join(60_000);
        check(!a.thread.isAlive(), "A did not close within 60 s");
        a.check();
        log("A left after consuming " + aConsumed + "; " + seen.size() + " distinct so far");
        b.throttleMs.set(0);
        waitFor(() -> { b.check(); return b.assigned.get().equals(all()); }, 60_000,
                "B to own every partition (owns " + b.assigned.get() + ")");
        long takeoverMs = System.currentTimeMillis();
        log("B owns " + b.assigned.get());
        waitFor(() -> { b.check(); return seen.size() >= n; }, 60_000, "B to consume the rest");
        b.stop.set(true);
        b.thread.join(60_000);
        check(!b.thread.isAlive(), "B did not close within 60 s");
        b.check();

        int dups = 0;
        for (int i = 0; i < n; i++) {
            AtomicInteger k = seen.get(i);
            check(k != null, "record " + i + " lost");
            dups += k.get() - 1;
        }
        check(seen.size() == n, "unexpected values: " + seen.size() + " distinct for " + n);

        // A fresh member: committed offsets are the log end offsets, and it
        // gets exactly the records produced after.
        Map<Integer, AtomicInteger> later = new ConcurrentHashMap<>();
        try (KafkaConsumer<String, String> c = consumer("C")) {
            Set<TopicPartition> tps = new HashSet<>();
            for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
            Map<TopicPartition, OffsetAndMetadata> committed = c.committed(tps, Duration.ofSeconds(30));
            Map<TopicPartition, Long> ends = c.endOffsets(tps, Duration.ofSeconds(30));
            for (TopicPartition tp : tps) {
                OffsetAndMetadata o = committed.get(tp);
                check(o != null, "no committed offset for " + tp);
                check(o.offset() == ends.get(tp), tp + " committed " + o.offset() + " != end " + ends.get(tp));
                check("java".equals(o.metadata()), tp + " committed metadata " + o.metadata());
            }
            log("committed == end offsets " + ends.values());
            c.subscribe(List.of(topic));
            // Join first, so the new records are read from the committed
            // offsets, not from wherever the member happens to start.
            waitFor(() -> { c.poll(Duration.ofMillis(100)).forEach(r -> later.computeIfAbsent(
                    Integer.parseInt(r.value()), k -> new AtomicInteger()).incrementAndGet());
                    return c.assignment().size() == partitions; }, 60_000, "C to own every partition");
            produce(n, 2 * n);
            long until = System.currentTimeMillis() + 60_000;
            while (later.size() < n && System.currentTimeMillis() < until) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    later.computeIfAbsent(Integer.parseInt(r.value()), k -> new AtomicInteger()).incrementAndGet();
                }
            }
            // A little longer: anything more would be a duplicate.
            for (int i = 0; i < 3; i++) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    later.computeIfAbsent(Integer.parseInt(r.value()), k -> new AtomicInteger()).incrementAndGet();
                }
            }
            c.commitSync(Duration.ofSeconds(30));
        }
        for (int i = n; i < 2 * n; i++) {
            AtomicInteger k = later.get(i);
            check(k != null, "resumed consumer missed record " + i);
            check(k.get() == 1, "resumed consumer got record " + i + " " + k.get() + " times");
        }
        check(later.size() == n, "resumed consumer got " + later.size() + " distinct records, "
                + "some from before the committed offsets");

        System.out.printf("RESULT protocol=%s records=%d duplicates=%d a_consumed=%d b_consumed=%d "
                + "takeover_ms=%d total_ms=%d%n", protocol, n, dups, aConsumed, b.consumed.get(),
                takeoverMs - start, System.currentTimeMillis() - start);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: GroupTakeover BOOTSTRAP TOPIC PARTITIONS GROUP classic|consumer N");
            System.exit(64);
        }
        bootstrap = args[0];
        topic = args[1];
        partitions = Integer.parseInt(args[2]);
        group = args[3];
        protocol = args[4];
        n = Integer.parseInt(args[5]);
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(DEADLINE_MS);
                System.out.println("FAIL deadline of " + DEADLINE_MS + " ms passed");
                Runtime.getRuntime().halt(3);
            } catch (InterruptedException ignored) {
            }
        });
        watchdog.setDaemon(true);
        watchdog.start();
        try {
            run();
        } catch (Failed f) {
            System.out.println("FAIL " + f.getMessage());
            System.exit(1);
        } catch (Throwable t) {
            System.out.println("FAIL exception " + t);
            t.printStackTrace(System.out);
            System.exit(2);
        }
        System.exit(0);
    }
}
