package statequery;

import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The scan of a statequery table: only the top-level columns a query needs cross from Python
 * (none for {@code count(*)}); the planning (the Python data source's {@code reader(schema)}
 * and {@code partitions()}) runs in a pooled Python worker, once per scan.
 */
final class StatequeryScan implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
  private final StructType schema;
  private final Map<String, String> options;
  private StructType readSchema;
  private byte[] reader;
  private InputPartition[] partitions;

  StatequeryScan(StructType schema, Map<String, String> options) {
    this.schema = schema;
    this.options = new HashMap<>(options);
    this.readSchema = schema;
  }

  @Override
  public void pruneColumns(StructType required) {
    Set<String> names = new HashSet<>();
    for (StructField f : required.fields()) {
      names.add(f.name());
    }
    List<StructField> kept = new ArrayList<>();
    for (StructField f : schema.fields()) {
      if (names.contains(f.name())) {
        kept.add(f);  // whole columns: nested fields are not pruned
      }
    }
    readSchema = new StructType(kept.toArray(new StructField[0]));
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return readSchema;
  }

  @Override
  public String description() {
    return "statequery columns " + String.join(",", readSchema.fieldNames());
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return ColumnarSupportMode.SUPPORTED;
  }

  @Override
  public synchronized InputPartition[] planInputPartitions() {
    if (partitions == null) {
      Map<String, Object> request = new HashMap<>();
      request.put("options", options);
      request.put("schema", schema.json());
      JsonNode plan = DefaultSource.planning("plan", () -> PythonWorker.request('P', request));
      Base64.Decoder b64 = Base64.getDecoder();
      reader = b64.decode(plan.get("reader").asText());
      List<InputPartition> out = new ArrayList<>();
      for (JsonNode p : plan.get("partitions")) {
        out.add(new StatequeryPartition(out.size(), b64.decode(p.asText())));
      }
      partitions = out.toArray(new InputPartition[0]);
    }
    return partitions;
  }

  @Override
  public synchronized PartitionReaderFactory createReaderFactory() {
    planInputPartitions();
    return new StatequeryReaderFactory(reader, readSchema.fieldNames(), readSchema.json());
  }
}
