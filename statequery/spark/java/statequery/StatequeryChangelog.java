package statequery;

import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.Changelog;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A state's change feed as Spark's change data capture ({@code CHANGES FROM VERSION ...}): the
 * rows of {@code statequery.spark.cdc} (an update as its pre- and post-image), each version's
 * changes against the complete version before it: no carry-over rows, one change per entry and
 * version; an entry is named by its row id columns, so Spark computes net changes itself.
 */
final class StatequeryChangelog implements Changelog {
  static final String[] ROW_ID = {
    "operator_id", "state", "key", "namespace", "user_key", "timestamp", "subtask", "index"
  };

  private final StructType schema;
  private final Map<String, String> options;
  private final String name;

  StatequeryChangelog(StructType schema, Map<String, String> options, String name) {
    this.schema = schema;
    this.options = options;
    this.name = name;
  }

  @Override
  public String name() {
    return name;
  }

  @Override
  public Column[] columns() {
    Column[] out = new Column[schema.fields().length];
    for (int i = 0; i < out.length; i++) {
      StructField f = schema.fields()[i];
      out[i] = Column.create(f.name(), f.dataType(), f.nullable());
    }
    return out;
  }

  @Override
  public boolean containsCarryoverRows() {
    return false;
  }

  /** An entry changed in several versions of the range has one change per version. */
  @Override
  public boolean containsIntermediateChanges() {
    return true;
  }

  @Override
  public boolean representsUpdateAsDeleteAndInsert() {
    return false;
  }

  @Override
  public NamedReference[] rowId() {
    NamedReference[] out = new NamedReference[ROW_ID.length];
    for (int i = 0; i < out.length; i++) {
      out[i] = Expressions.column(ROW_ID[i]);
    }
    return out;
  }

  @Override
  public NamedReference rowVersion() {
    return Expressions.column("_commit_version");
  }

  /** Spark's own change data capture options: the range and how to post-process it. */
  private static final Set<String> SPARK_OPTIONS = Set.of(
      "startingversion", "endingversion", "startingtimestamp", "endingtimestamp",
      "startingboundinclusive", "endingboundinclusive", "deduplicationmode", "computeupdates");

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
    Map<String, String> merged = new HashMap<>();
    for (Map.Entry<String, String> e : given.asCaseSensitiveMap().entrySet()) {
      if (!SPARK_OPTIONS.contains(e.getKey().toLowerCase(Locale.ROOT))) {
        merged.put(e.getKey(), e.getValue());  // statequery's own, e.g. key
      }
    }
    merged.putAll(options);  // the range chosen by loadChangelog
    return new StatequeryScan(schema, merged);
  }
}
