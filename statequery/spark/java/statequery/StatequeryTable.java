package statequery;

import java.util.EnumSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A statequery table: its schema carries the read's options (see the Python data source). */
final class StatequeryTable implements SupportsRead {
  private final StructType schema;

  StatequeryTable(StructType schema) {
    this.schema = schema;
  }

  @Override
  public String name() {
    return "statequery";
  }

  @Override
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new StatequeryScan(schema, options.asCaseSensitiveMap());
  }
}
