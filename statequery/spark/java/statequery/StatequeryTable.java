package statequery;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A statequery table: its schema carries the read's options (see the Python data source); a
 * table of {@link StatequeryCatalog} also carries the options that name it (catalog, database,
 * table, version), under the query's own.
 */
final class StatequeryTable implements SupportsRead {
  private final StructType schema;
  private final Map<String, String> options;
  private final String name;

  StatequeryTable(StructType schema) {
    this(schema, Map.of(), "statequery");
  }

  StatequeryTable(StructType schema, Map<String, String> options, String name) {
    this.schema = schema;
    this.options = options;
    this.name = name;
  }

  @Override
  public String name() {
    return name;
  }

  @Override
  public StructType schema() {
    return schema;
  }

  @Override
  public Map<String, String> properties() {
    return options;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
    Map<String, String> merged = new HashMap<>(options);
    merged.putAll(given.asCaseSensitiveMap());
    return new StatequeryScan(schema, merged);
  }
}
