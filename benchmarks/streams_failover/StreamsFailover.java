/*
 * One Kafka Streams instance of a KTable application, for benchmarks/bench_failover.py: three of these
 * JVMs share an application.id; the driver SIGKILLs one and times how long the two others take to
 * run its tasks again (rebalance + restore). Compiled and run by benchmarks/kafka_streams_restore.py's
 * resolver against the kafka-streams jars from Maven Central.
 *
 * Usage: java -cp <classes>:<lib>/* StreamsFailover --bootstrap HOST:PORT --topic T --app-id ID
 *            --state-dir DIR --session-timeout-ms MS --heartbeat-interval-ms MS [--poll-ms 20]
 *
 * Topology: builder.table(topic, Materialized.as(store)) with topology.optimization=all, so the source
 * topic is the store's changelog (as StreamsRestore's ktable mode): a task moved to another instance
 * restores its store from the source topic up to the group's committed offset (the driver commits the
 * end offsets before the start). num.standby.replicas=0, one stream thread, the classic group protocol
 * (Kafka Streams' default) with session.timeout.ms / heartbeat.interval.ms as given.
 *
 * Protocol on stdin/stdout (one JSON object per line, "t" = System.currentTimeMillis(), the wall clock
 * the driver shares):
 *   {"event": "built", ...}                 topology built; the instance waits for a line "go" on stdin,
 *                                           so the driver can start the three instances together
 *   {"event": "state", "from": S, "to": S}  KafkaStreams.StateListener
 *   {"event": "tasks", "partitions": [..]}  the active tasks' source partitions (metadataForLocalThreads,
 *                                           polled every --poll-ms), printed when they change
 *   {"event": "restore_start", "partition": P, "start": O, "end": O}    StateRestoreListener
 *   {"event": "restore_end", "partition": P, "restored": N}
 *   {"event": "error", "message": M}        uncaught exception (the client shuts down)
 * A line "stop" (or the end of stdin) closes the instance; the benchmark kills it with SIGKILL instead.
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public final class StreamsFailover {
    private static final String STORE = "failover-store";

    public static void main(final String[] argv) throws Exception {
        final Map<String, String> args = parse(argv);
        final String topic = required(args, "topic");
        final long pollMs = Long.parseLong(args.getOrDefault("poll-ms", "20"));

        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, required(args, "app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(args, "bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, required(args, "state-dir"));
        props.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        props.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG),
                  Integer.parseInt(required(args, "session-timeout-ms")));
        props.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG),
                  Integer.parseInt(required(args, "heartbeat-interval-ms")));

        final StreamsBuilder builder = new StreamsBuilder();
        builder.table(topic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()),
                      Materialized.<byte[], byte[], KeyValueStore<Bytes, byte[]>>as(STORE)
                          .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.ByteArray()));
        final Topology topology = builder.build(props);
        final KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(final TopicPartition partition, final String store, final long start,
                                       final long end) {
                emit("restore_start", "\"partition\": " + partition.partition() + ", \"start\": " + start
                    + ", \"end\": " + end);
            }

            @Override
            public void onBatchRestored(final TopicPartition partition, final String store, final long batchEnd,
                                        final long numRestored) {
            }

            @Override
            public void onRestoreEnd(final TopicPartition partition, final String store, final long totalRestored) {
                emit("restore_end", "\"partition\": " + partition.partition() + ", \"restored\": " + totalRestored);
            }
        });
        streams.setStateListener((newState, oldState) ->
            emit("state", "\"from\": \"" + oldState + "\", \"to\": \"" + newState + "\""));
        streams.setUncaughtExceptionHandler(exception -> {
            emit("error", "\"message\": \"" + String.valueOf(exception).replace("\\", "\\\\").replace("\"", "'")
                .replace('\n', ' ') + "\"");
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        emit("built", "\"pid\": " + ProcessHandle.current().pid());
        final BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        final String go = stdin.readLine();
        if (!"go".equals(go)) {
            Runtime.getRuntime().halt(0);
        }
        streams.start();
        emit("started", "");

        final Thread poller = new Thread(() -> pollTasks(streams, pollMs), "task-poller");
        poller.setDaemon(true);
        poller.start();
        while (true) {
            final String line = stdin.readLine();
            if (line == null || line.equals("stop")) {
                break;
            }
        }
        streams.close(Duration.ofSeconds(10));
        emit("closed", "");
        Runtime.getRuntime().halt(0);
    }

    /** Prints the active tasks' source partitions whenever they change (every {@code pollMs} ms). */
    private static void pollTasks(final KafkaStreams streams, final long pollMs) {
        Set<Integer> last = null;
        while (true) {
            final Set<Integer> now = new TreeSet<>();
            try {
                for (final ThreadMetadata thread : streams.metadataForLocalThreads()) {
                    for (final TaskMetadata task : thread.activeTasks()) {
                        for (final TopicPartition partition : task.topicPartitions()) {
                            now.add(partition.partition());
                        }
                    }
                }
            } catch (final RuntimeException exception) {
                // not started yet or shutting down: report nothing this round
            }
            if (!now.equals(last)) {
                emit("tasks", "\"partitions\": " + now);
                last = now;
            }
            try {
                Thread.sleep(pollMs);
            } catch (final InterruptedException exception) {
                return;
            }
        }
    }

    private static synchronized void emit(final String event, final String fields) {
        System.out.println("{\"event\": \"" + event + "\", \"t\": " + System.currentTimeMillis()
            + (fields.isEmpty() ? "" : ", " + fields) + "}");
        System.out.flush();
    }

    private static Map<String, String> parse(final String[] argv) {
        final Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + String.join(" ", argv));
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        return args;
    }

    private static String required(final Map<String, String> args, final String name) {
        final String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }
}
