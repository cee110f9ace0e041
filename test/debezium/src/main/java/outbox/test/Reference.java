/*
 * Maintainer-only reference tool for the outbox extension's tests; optional, never run by CI.
 *
 * For each case read as one JSON line on stdin, it builds the change event Debezium's
 * PostgreSQL connector emits for an insert into an outbox table, runs it through the REAL
 * Debezium 3.6.1.Final outbox EventRouter SMT and the REAL Kafka Connect 4.3.0 converters
 * (JsonConverter with schemas.enable=false, or StringConverter; SimpleHeaderConverter for
 * headers), and writes one JSON line on stdout with the exact key and value bytes (hex),
 * the headers, the topic and the partition Kafka's Java producer would choose for the key.
 * test/debezium/check runs it on cases.jsonl, whose expected records
 * test/t/209_debezium_bytes.pl checks the extension against.
 *
 * Input and output fields are described in test/debezium/run, which builds and runs it.
 */
package outbox.test;

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;
import org.apache.kafka.connect.storage.StringConverter;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.data.Envelope;
import io.debezium.data.Json;
import io.debezium.data.Uuid;
import io.debezium.transforms.outbox.EventRouter;

public final class Reference {

    static final ObjectMapper MAPPER = new ObjectMapper();
    static final String EVENT_ID = "406c07f3-26f0-4eea-a50c-109940064b8f";
    static final String TOPIC_PREFIX = "outbox";
    static final Instant TS = Instant.ofEpochMilli(1_700_000_000_000L);

    /** Records EventRouter's warnings (slf4j-jdk14 routes them to java.util.logging). */
    static final List<LogRecord> WARNINGS = new ArrayList<>();
    /** Held here: java.util.logging keeps loggers only weakly, and with them our handler. */
    static final Logger ROUTER_LOG = Logger.getLogger("io.debezium.transforms.outbox.EventRouterDelegate");

    public static void main(String[] args) throws Exception {
        System.err.println("java.version=" + System.getProperty("java.version"));
        Logger.getLogger("").setLevel(Level.WARNING); // no INFO dumps of converter configs
        ROUTER_LOG.setUseParentHandlers(false); // keep stack traces of expected failures off stderr
        ROUTER_LOG.addHandler(new Handler() {
            @Override public void publish(LogRecord r) { if (r.getLevel().intValue() >= Level.WARNING.intValue()) WARNINGS.add(r); }
            @Override public void flush() { }
            @Override public void close() { }
        });

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        for (String line; (line = in.readLine()) != null;) {
            if (!line.isBlank()) {
                out.println(MAPPER.writeValueAsString(runCase(MAPPER.readTree(line))));
            }
        }
    }

    static ObjectNode runCase(JsonNode c) {
        ObjectNode o = MAPPER.createObjectNode();
        o.set("name", c.get("name"));
        WARNINGS.clear();
        try (EventRouter<SourceRecord> router = new EventRouter<>()) {
            Map<String, String> cfg = new HashMap<>();
            cfg.put("table.expand.json.payload", String.valueOf(c.path("expand").asBoolean(false)));
            cfg.put("route.tombstone.on.empty.payload", String.valueOf(c.path("tombstone").asBoolean(false)));
            if (c.path("envelope").asBoolean(false)) {
                cfg.put("table.fields.additional.placement", "type:envelope:eventType");
            }
            router.configure(cfg);

            SourceRecord routed = router.apply(changeEvent(c));
            if (routed == null) {
                throw new IllegalStateException("EventRouter dropped the record");
            }

            // What WorkerSourceTask.convertTransformedRecord does: headers, then key, then value.
            RecordHeaders headers = new RecordHeaders();
            ObjectNode headersOut = o.objectNode();
            try (SimpleHeaderConverter hc = new SimpleHeaderConverter()) {
                hc.configure(Map.of());
                for (Header h : routed.headers()) {
                    byte[] b = hc.fromConnectHeader(routed.topic(), h.key(), h.schema(), h.value());
                    headers.add(h.key(), b);
                    headersOut.put(h.key(), b == null ? null : new String(b, StandardCharsets.UTF_8));
                }
            }
            byte[] key = converter(c.path("key_converter").asText("string"), true)
                    .fromConnectData(routed.topic(), headers, routed.keySchema(), routed.key());
            byte[] value = converter(c.path("value_converter").asText("json"), false)
                    .fromConnectData(routed.topic(), headers, routed.valueSchema(), routed.value());

            o.put("key_hex", key == null ? null : HexFormat.of().formatHex(key));
            o.put("value_hex", value == null ? null : HexFormat.of().formatHex(value));
            if (routed.kafkaPartition() != null) {
                o.put("partition", routed.kafkaPartition());
            }
            else if (key == null) {
                o.putNull("partition"); // the producer's sticky partitioner picks one
            }
            else {
                o.put("partition", BuiltInPartitioner.partitionForKey(key, c.path("partitions").asInt(1)));
            }
            o.put("topic", routed.topic());
            o.set("headers", headersOut);
            o.putNull("error");
        }
        catch (Exception e) {
            o.putNull("key_hex");
            o.putNull("value_hex");
            o.putNull("partition");
            o.putNull("topic");
            o.putNull("headers");
            o.put("error", e.toString());
        }
        LogRecord expansion = WARNINGS.stream()
                .filter(r -> "JSON expansion failed".equals(r.getMessage())).findFirst().orElse(null);
        o.put("expansion_warning", expansion != null);
        if (expansion != null && expansion.getThrown() != null) {
            o.put("expansion_cause", expansion.getThrown().toString());
        }
        return o;
    }

    /** The insert event Debezium's PostgreSQL connector emits for one outbox row. */
    static SourceRecord changeEvent(JsonNode c) {
        boolean jsonb = !"text".equals(c.path("payload_type").asText("jsonb"));
        Schema payloadSchema = jsonb ? Json.builder().optional().build() : Schema.OPTIONAL_STRING_SCHEMA;
        String table = TOPIC_PREFIX + ".public.outboxevent";

        Schema keySchema = SchemaBuilder.struct().name(table + ".Key")
                .field("id", Uuid.builder().build())
                .build();
        Schema rowSchema = SchemaBuilder.struct().name(table + ".Value").optional()
                .field("id", Uuid.builder().build())
                .field("aggregatetype", Schema.OPTIONAL_STRING_SCHEMA)
                .field("aggregateid", Schema.OPTIONAL_STRING_SCHEMA)
                .field("type", Schema.OPTIONAL_STRING_SCHEMA)
                .field("payload", payloadSchema)
                .build();
        Schema sourceSchema = SchemaBuilder.struct().name("io.debezium.connector.postgresql.Source")
                .field("version", Schema.STRING_SCHEMA)
                .field("connector", Schema.STRING_SCHEMA)
                .field("name", Schema.STRING_SCHEMA)
                .field("ts_ms", Schema.INT64_SCHEMA)
                .field("db", Schema.STRING_SCHEMA)
                .field("schema", Schema.STRING_SCHEMA)
                .field("table", Schema.STRING_SCHEMA)
                .build();
        Envelope envelope = Envelope.defineSchema()
                .withName(table + ".Envelope")
                .withRecord(rowSchema)
                .withSource(sourceSchema)
                .build();

        Struct after = new Struct(rowSchema)
                .put("id", EVENT_ID)
                .put("aggregatetype", "Order")
                .put("aggregateid", text(c, "key"))
                .put("type", "OrderCreated")
                .put("payload", text(c, "payload"));
        Struct source = new Struct(sourceSchema)
                .put("version", "3.6.1.Final").put("connector", "postgresql").put("name", TOPIC_PREFIX)
                .put("ts_ms", TS.toEpochMilli()).put("db", "postgres").put("schema", "public")
                .put("table", "outboxevent");
        Struct key = new Struct(keySchema).put("id", EVENT_ID);

        return new SourceRecord(Map.of("server", TOPIC_PREFIX), Map.of("lsn", 1L), table, null,
                keySchema, key, envelope.schema(), envelope.create(after, source, TS));
    }

    static Converter converter(String kind, boolean isKey) {
        Converter conv;
        if ("json".equals(kind)) {
            conv = new JsonConverter();
            conv.configure(Map.of("schemas.enable", "false"), isKey);
        }
        else if ("string".equals(kind)) {
            conv = new StringConverter();
            conv.configure(Map.of(), isKey);
        }
        else {
            throw new IllegalArgumentException("unknown converter " + kind);
        }
        return conv;
    }

    static String text(JsonNode c, String field) {
        JsonNode n = c.get(field);
        return n == null || n.isNull() ? null : n.asText();
    }
}
