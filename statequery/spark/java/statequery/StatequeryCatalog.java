package statequery;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.Changelog;
import org.apache.spark.sql.connector.catalog.ChangelogContext;
import org.apache.spark.sql.connector.catalog.ChangelogRange;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.NamespaceChange;
import org.apache.spark.sql.connector.catalog.SupportsNamespaces;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A statequery catalog folder as a Spark catalog: one namespace per database (a savepoint, or a
 * job's checkpoint directory), one table per state, {@code state_meta} and the operator tables;
 * read-only.
 *
 * <pre>
 *   spark.sql.catalog.sq       = statequery.StatequeryCatalog
 *   spark.sql.catalog.sq.root  = /path/to/catalog        (default: statequery's default catalog)
 *
 *   SELECT * FROM sq.orders_job.counter__count VERSION AS OF 42
 *   SELECT * FROM sq.orders_job.counter__count TIMESTAMP AS OF '2026-11-27 10:00:00'
 * </pre>
 *
 * <p>This is where Spark lets a data source time-travel: {@code VERSION AS OF n} reads the
 * job's version with checkpoint id {@code n} (the data source's {@code version} option), {@code
 * TIMESTAMP AS OF t} the newest complete version that completed at or before {@code t}. Which
 * databases, tables and versions there are is decided by the Python code (a pooled worker,
 * {@code statequery.spark.jvmworker}), as for every other read.
 */
public final class StatequeryCatalog implements TableCatalog, SupportsNamespaces {
  private String name;
  private String root;

  @Override
  public void initialize(String name, CaseInsensitiveStringMap options) {
    this.name = name;
    this.root = options.getOrDefault("root", "");
  }

  @Override
  public String name() {
    return name;
  }

  private Map<String, Object> request() {
    Map<String, Object> request = new HashMap<>();
    request.put("catalog", root());
    return request;
  }

  /** The catalog folder: the {@code root} option, else statequery's default catalog. */
  private synchronized String root() {
    if (root.isEmpty()) {
      root = call('L', new HashMap<>(), "initialize").get("catalog").asText();
    }
    return root;
  }

  private static String database(String[] namespace) throws NoSuchNamespaceException {
    if (namespace.length != 1) {
      throw new NoSuchNamespaceException(namespace);
    }
    return namespace[0];
  }

  private JsonNode call(char kind, Map<String, Object> request, String action) {
    return DefaultSource.planning(action, () -> PythonWorker.request(kind, request));
  }

  // -- namespaces --------------------------------------------------------------------------

  @Override
  public String[][] listNamespaces() {
    List<String[]> out = new ArrayList<>();
    for (JsonNode db : call('L', request(), "listNamespaces").get("databases")) {
      out.add(new String[] {db.asText()});
    }
    return out.toArray(new String[0][]);
  }

  @Override
  public String[][] listNamespaces(String[] namespace) throws NoSuchNamespaceException {
    if (namespace.length == 0) {
      return listNamespaces();
    }
    loadNamespaceMetadata(namespace);
    return new String[0][];
  }

  @Override
  public boolean namespaceExists(String[] namespace) {
    return namespace.length == 1 && lookup(namespace[0]) != null;
  }

  /** The database's entry ({@code name}, {@code location}, ...), or null when there is none. */
  private JsonNode lookup(String database) {
    Map<String, Object> request = request();
    request.put("database", database);
    JsonNode found = call('L', request, "loadNamespaceMetadata").get("database");
    return found == null || found.isNull() ? null : found;
  }

  @Override
  public Map<String, String> loadNamespaceMetadata(String[] namespace)
      throws NoSuchNamespaceException {
    JsonNode found = lookup(database(namespace));
    if (found == null) {
      throw new NoSuchNamespaceException(namespace);
    }
    Map<String, String> out = new HashMap<>();
    found.fields().forEachRemaining(e -> out.put(e.getKey(), e.getValue().asText()));
    return out;
  }

  @Override
  public void createNamespace(String[] namespace, Map<String, String> metadata) {
    throw readOnly();
  }

  @Override
  public void alterNamespace(String[] namespace, NamespaceChange... changes) {
    throw readOnly();
  }

  @Override
  public boolean dropNamespace(String[] namespace, boolean cascade) {
    throw readOnly();
  }

  // -- tables ------------------------------------------------------------------------------

  @Override
  public Identifier[] listTables(String[] namespace) throws NoSuchNamespaceException {
    String db = database(namespace);
    if (lookup(db) == null) {
      throw new NoSuchNamespaceException(namespace);
    }
    Map<String, Object> request = request();
    request.put("database", db);
    List<Identifier> out = new ArrayList<>();
    for (JsonNode t : call('T', request, "listTables").get("tables")) {
      out.add(Identifier.of(namespace, t.asText()));
    }
    return out.toArray(new Identifier[0]);
  }

  @Override
  public Table loadTable(Identifier ident) throws NoSuchTableException {
    return load(ident, null);
  }

  @Override
  public Table loadTable(Identifier ident, String version) throws NoSuchTableException {
    return load(ident, version);
  }

  @Override
  public Table loadTable(Identifier ident, long timestampMicros) throws NoSuchTableException {
    Map<String, Object> request = request();
    request.put("database", databaseOf(ident));
    request.put("timestamp_micros", timestampMicros);
    JsonNode found = call('V', request, "loadTable");
    return load(ident, found.get("version").asText());
  }

  /**
   * The change feed of a table between two versions ({@code CHANGES FROM VERSION a TO VERSION
   * b}, or timestamps: the versions that completed between them), in Spark's change data
   * capture layout.
   */
  @Override
  public Changelog loadChangelog(
      Identifier ident, ChangelogContext context, CaseInsensitiveStringMap given)
      throws NoSuchTableException {
    Long start = null;
    Long end = null;
    ChangelogRange range = context.range();
    if (range instanceof ChangelogRange.VersionRange v) {
      start = checkpointId(v.startingVersion()) + (v.startingBoundInclusive() ? 0 : 1);
      if (v.endingVersion().isPresent()) {
        end = checkpointId(v.endingVersion().get()) - (v.endingBoundInclusive() ? 0 : 1);
      }
    } else if (range instanceof ChangelogRange.TimestampRange t) {
      Map<String, Object> request = request();
      request.put("database", databaseOf(ident));
      request.put("start_micros", t.startingTimestamp());
      request.put("start_inclusive", t.startingBoundInclusive());
      t.endingTimestamp().ifPresent(e -> request.put("end_micros", e));
      request.put("end_inclusive", t.endingBoundInclusive());
      JsonNode found = call('W', request, "loadChangelog");
      if (found.get("empty").asBoolean()) {
        start = -1L;  // no version completed in the range: no checkpoint id is -1
        end = -1L;
      } else {
        start = found.get("start").asLong();
        end = found.get("end").asLong();
      }
    }
    if (start != null && end != null && start > end) {
      start = -1L;  // an empty range (e.g. FROM VERSION 3 EXCLUSIVE TO VERSION 4 EXCLUSIVE)
      end = -1L;
    }
    Map<String, String> options = new HashMap<>();
    options.put("catalog", root());
    options.put("database", databaseOf(ident));
    options.put("table", ident.name());
    options.put("changes", "true");
    options.put("cdc", "true");
    if (start != null) {
      options.put("start", Long.toString(start));
    }
    if (end != null) {
      options.put("end", Long.toString(end));
    }
    StructType schema = schemaOf(ident, options, null);
    return new StatequeryChangelog(schema, options, name + "." + ident + " changes");
  }

  private static long checkpointId(String version) {
    try {
      return Long.parseLong(version.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(
          "a statequery version is a checkpoint id (an integer), got '" + version + "'");
    }
  }

  private String databaseOf(Identifier ident) throws NoSuchTableException {
    if (ident.namespace().length != 1) {
      throw new NoSuchTableException(ident);
    }
    return ident.namespace()[0];
  }

  private Table load(Identifier ident, String version) throws NoSuchTableException {
    Map<String, String> options = new HashMap<>();
    options.put("catalog", root());
    options.put("database", databaseOf(ident));
    options.put("table", ident.name());
    if (version != null) {
      options.put("version", version);
    }
    StructType schema = schemaOf(ident, options, version);
    return new StatequeryTable(schema, options, name + "." + ident);
  }

  /** The schema of a read with these options; an unknown table is Spark's NoSuchTable. */
  private StructType schemaOf(Identifier ident, Map<String, String> options, String version)
      throws NoSuchTableException {
    Map<String, Object> request = new HashMap<>();
    request.put("options", options);
    JsonNode answer;
    try {
      answer = PythonWorker.request('S', request);
    } catch (StatequeryException e) {
      String type = e.pythonType();
      if (type != null && (type.endsWith("NoSuchTableError")
          || type.endsWith("SavepointNotFoundError") && version == null)) {
        throw new NoSuchTableException(ident);
      }
      return DefaultSource.planning("loadTable", () -> {
        throw e;
      });
    }
    return (StructType) DataType.fromJson(answer.get("schema").asText());
  }

  @Override
  public Table alterTable(Identifier ident, TableChange... changes) {
    throw readOnly();
  }

  @Override
  public boolean dropTable(Identifier ident) {
    throw readOnly();
  }

  @Override
  public void renameTable(Identifier oldIdent, Identifier newIdent) {
    throw readOnly();
  }

  private UnsupportedOperationException readOnly() {
    return new UnsupportedOperationException(
        "statequery catalog " + name + " is read-only: it shows the savepoints in " + root());
  }
}
