/*
 * Cold start of a Kafka Streams application on an empty state directory, for
 * benchmarks/bench_materializer.py (--cold-start-only). Compiled and run by
 * benchmarks/kafka_streams_restore.py against the kafka-streams jars it resolves from Maven Central.
 *
 * Usage: java -cp <classes>:<lib>/* StreamsRestore --bootstrap HOST:PORT --topic T --mode MODE
 *            --state-dir DIR --app-id ID [--expected-records N] [--timeout-s S]
 *            [--warmup-topic T2 --warmup-records N2]
 *
 * --warmup-topic: first the same cold start on a small topic T2 (application.id ID-warmup, state
 * dir DIR-warmup), so that the measured run does not include the JVM's class loading, the
 * extraction and loading of RocksDB's JNI library and the first JIT compilations; its seconds to
 * ready are reported as warmup_seconds_to_ready (-1 without a warm-up).
 *
 * MODE (byte[] keys and values; a null value is a tombstone):
 *   global        builder.globalTable(topic, Materialized.as(store)): KafkaStreams.start() blocks
 *                 while the GlobalStreamThread restores the store up to the topic's end offsets;
 *                 ready = state RUNNING.
 *   ktable        builder.table(topic, Materialized.as(store)) with topology.optimization=all, so
 *                 the source topic is the store's changelog (no -changelog topic). The restore of
 *                 a source-topic changelog stops at min(end offset, committed offset of the group)
 *                 (StoreChangelogReader), and a fresh application.id has no committed offset, so
 *                 the group's offsets are first set to the end offsets (Admin
 *                 alterConsumerGroupOffsets): the cold start of a deployed application whose
 *                 instance lost its disk. Ready = state RUNNING (a StreamThread turns RUNNING once
 *                 every task is restored).
 *   ktable-fresh  the same topology and a fresh application.id without committed offsets: nothing
 *                 is restored, every record is processed after RUNNING; ready = the stream threads'
 *                 process-total (stream-thread-metrics) reached --expected-records.
 *
 * Prints one JSON line on stdout: mode, seconds_to_running and seconds_to_ready (from just before
 * KafkaStreams.start()), records_restored (StateRestoreListener.onBatchRestored sums),
 * records_processed, entries (an exact count over the store's all() iterator, after ready) and
 * entries_approx (approximateNumEntries, RocksDB's estimate), seconds_in_start (the call to start()
 * itself: it blocks while a global store restores), jvm_s (JVM start to main()).
 * Exit status 1 with {"error": ...} on a timeout or a Streams error.
 */

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

public final class StreamsRestore {
    private static final String STORE = "cold-start-store";

    /** One cold start's figures (seconds from just before {@code start()}). */
    private record Result(double toRunning, double toReady, double inStart, long restored, long processed,
                          long entries, long approx) {
    }

    public static void main(final String[] argv) throws Exception {
        final Map<String, String> args = parse(argv);
        final String mode = required(args, "mode");
        final String topic = required(args, "topic");
        final String bootstrap = required(args, "bootstrap");
        final String appId = required(args, "app-id");
        final String stateDir = required(args, "state-dir");
        final long expected = Long.parseLong(args.getOrDefault("expected-records", "-1"));
        final long timeoutMs = (long) (Double.parseDouble(args.getOrDefault("timeout-s", "600")) * 1000);
        if (!List.of("global", "ktable", "ktable-fresh").contains(mode)) {
            fail(mode, "--mode must be global, ktable or ktable-fresh, not " + mode);
        }
        if (mode.equals("ktable-fresh") && expected < 0) {
            fail(mode, "--mode ktable-fresh needs --expected-records");
        }
        final double jvmS = (System.currentTimeMillis() - ManagementFactory.getRuntimeMXBean().getStartTime()) / 1000.0;
        double warmupS = -1;
        final String warmupTopic = args.get("warmup-topic");
        if (warmupTopic != null) {
            // Same mode on a small topic first: class loading, RocksDB's JNI library, JIT.
            final long warmupExpected = Long.parseLong(args.getOrDefault("warmup-records", "-1"));
            warmupS = coldStart(mode, bootstrap, warmupTopic, appId + "-warmup", stateDir + "-warmup",
                                warmupExpected, timeoutMs).toReady();
        }
        final Result r = coldStart(mode, bootstrap, topic, appId, stateDir, expected, timeoutMs);
        System.out.printf("{\"mode\": \"%s\", \"seconds_to_running\": %.4f, \"seconds_to_ready\": %.4f, "
                + "\"records_restored\": %d, \"records_processed\": %d, \"entries\": %d, \"entries_approx\": %d, "
                + "\"seconds_in_start\": %.4f, \"warmup_seconds_to_ready\": %.4f, \"jvm_s\": %.3f}%n",
            mode, r.toRunning(), r.toReady(), r.restored(), r.processed(), r.entries(), r.approx(), r.inStart(),
            warmupS, jvmS);
        System.out.flush();
        // Exit at once: nothing to clean up, and halting skips the JVM's shutdown hooks' waits.
        Runtime.getRuntime().halt(0);
    }

    /** Builds the topology of {@code mode} on {@code topic}, starts it on an empty {@code stateDir}, waits until
     * ready, counts the store's entries and closes the application. Exits through {@link #fail} on an error. */
    private static Result coldStart(final String mode, final String bootstrap, final String topic, final String appId,
                                    final String stateDir, final long expected, final long timeoutMs) throws Exception {
        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);

        final StreamsBuilder builder = new StreamsBuilder();
        final Consumed<byte[], byte[]> consumed = Consumed.with(Serdes.ByteArray(), Serdes.ByteArray());
        final Materialized<byte[], byte[], KeyValueStore<Bytes, byte[]>> materialized =
            Materialized.<byte[], byte[], KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.ByteArray());
        if (mode.equals("global")) {
            builder.globalTable(topic, consumed, materialized);
        } else {
            builder.table(topic, consumed, materialized);
        }
        final Topology topology = builder.build(props);

        if (mode.equals("ktable")) {
            commitEndOffsets(bootstrap, topic, appId);
        }

        final AtomicLong restored = new AtomicLong();
        final AtomicReference<Throwable> error = new AtomicReference<>();
        final CountDownLatch running = new CountDownLatch(1);
        final AtomicLong runningNs = new AtomicLong();
        final KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(final TopicPartition partition, final String store, final long start, final long end) {
            }

            @Override
            public void onBatchRestored(final TopicPartition partition, final String store, final long batchEnd,
                                        final long numRestored) {
                restored.addAndGet(numRestored);
            }

            @Override
            public void onRestoreEnd(final TopicPartition partition, final String store, final long totalRestored) {
            }
        });
        streams.setStateListener((newState, oldState) -> {
            if (newState == KafkaStreams.State.RUNNING) {
                runningNs.compareAndSet(0, System.nanoTime());
                running.countDown();
            } else if (newState == KafkaStreams.State.ERROR || newState == KafkaStreams.State.PENDING_ERROR) {
                error.compareAndSet(null, new IllegalStateException("Kafka Streams went " + newState));
                running.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(exception -> {
            error.compareAndSet(null, exception);
            running.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        final long started = System.nanoTime();
        final long deadline = started + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        try {
            streams.start();
            final double inStart = (System.nanoTime() - started) / 1e9;
            if (!running.await(timeoutMs, TimeUnit.MILLISECONDS)) {
                fail(mode, topic + ": not RUNNING within " + timeoutMs + " ms (state " + streams.state() + ")");
            }
            if (error.get() != null) {
                fail(mode, topic + ": Kafka Streams failed: " + error.get());
            }
            final double toRunning = (runningNs.get() - started) / 1e9;
            long processed = processTotal(streams);
            if (mode.equals("ktable-fresh")) {
                while (processed < expected) {
                    if (error.get() != null) {
                        fail(mode, topic + ": Kafka Streams failed: " + error.get());
                    }
                    if (System.nanoTime() > deadline) {
                        fail(mode, topic + ": processed " + processed + " of " + expected + " records within "
                            + timeoutMs + " ms");
                    }
                    Thread.sleep(5);
                    processed = processTotal(streams);
                }
            }
            final double toReady = (System.nanoTime() - started) / 1e9;
            final ReadOnlyKeyValueStore<byte[], byte[]> store = queryableStore(streams, deadline, mode);
            final long approx = store.approximateNumEntries();
            long entries = 0;
            try (KeyValueIterator<byte[], byte[]> all = store.all()) {
                while (all.hasNext()) {
                    final KeyValue<byte[], byte[]> entry = all.next();
                    if (entry.value != null) {
                        entries++;
                    }
                }
            }
            return new Result(toRunning, toReady, inStart, restored.get(), processed, entries, approx);
        } finally {
            streams.close(Duration.ofSeconds(30));
        }
    }

    /** Sets the consumer group {@code appId}'s committed offsets of every partition of {@code topic} to its end offset. */
    private static void commitEndOffsets(final String bootstrap, final String topic, final String appId) throws Exception {
        final Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(props)) {
            final TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            final Map<TopicPartition, OffsetSpec> request = new HashMap<>();
            for (final TopicPartitionInfo info : description.partitions()) {
                request.put(new TopicPartition(topic, info.partition()), OffsetSpec.latest());
            }
            final Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> ends = admin.listOffsets(request).all().get();
            final Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            ends.forEach((partition, info) -> offsets.put(partition, new OffsetAndMetadata(info.offset())));
            admin.alterConsumerGroupOffsets(appId, offsets).all().get();
        }
    }

    /** Sum of {@code process-total} (records processed) over the stream threads. */
    private static long processTotal(final KafkaStreams streams) {
        double total = 0;
        for (final Map.Entry<MetricName, ? extends Metric> entry : streams.metrics().entrySet()) {
            final MetricName name = entry.getKey();
            if (name.group().equals("stream-thread-metrics") && name.name().equals("process-total")) {
                total += ((Number) entry.getValue().metricValue()).doubleValue();
            }
        }
        return (long) total;
    }

    private static ReadOnlyKeyValueStore<byte[], byte[]> queryableStore(final KafkaStreams streams, final long deadline,
                                                                        final String mode) throws InterruptedException {
        while (true) {
            try {
                return streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.keyValueStore()));
            } catch (final InvalidStateStoreException exception) {
                if (System.nanoTime() > deadline) {
                    fail(mode, "store " + STORE + " not queryable: " + exception);
                }
                Thread.sleep(10);
            }
        }
    }

    private static Map<String, String> parse(final String[] argv) {
        final Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                fail("?", "expected --name value pairs, got " + String.join(" ", argv));
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        return args;
    }

    private static String required(final Map<String, String> args, final String name) {
        final String value = args.get(name);
        if (value == null) {
            fail(args.getOrDefault("mode", "?"), "missing --" + name);
        }
        return value;
    }

    private static void fail(final String mode, final String message) {
        System.out.println("{\"mode\": \"" + mode + "\", \"error\": \"" + message.replace("\\", "\\\\").replace("\"", "'").replace('\n', ' ') + "\"}");
        System.out.flush();
        Runtime.getRuntime().halt(1);
    }
}
