package statequery;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.AnalysisException;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code statequery} as a JVM DataSource V2 with columnar (Arrow) reads; what a read means is
 * decided by the Python data source's own code, in long-lived Python workers
 * ({@code statequery.spark.jvmworker}).
 *
 * <p>Spark resolves a provider name {@code statequery} to the class {@code
 * statequery.DefaultSource} when it is on the class path (before Python data sources), so the
 * same {@code USING statequery} and {@code format("statequery")} take this path when the jar is
 * there and the Python data source when it is not. No {@code META-INF/services} entry: a JVM
 * short name equal to a Python data source's name is an error in Spark.
 */
public final class DefaultSource implements TableProvider, DataSourceRegister {

  @Override
  public String shortName() {
    return "statequery";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    Map<String, Object> request = new HashMap<>();
    request.put("options", options.asCaseSensitiveMap());
    String json = planning("create", () -> PythonWorker.request('S', request))
        .get("schema").asText();
    return (StructType) DataType.fromJson(json);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new StatequeryTable(schema);
  }

  interface Call<T> {
    T run();
  }

  /** A planning step on the driver: a Python error becomes Spark's data source error. */
  static <T> T planning(String action, Call<T> call) {
    try {
      return call.run();
    } catch (StatequeryException e) {
      Map<String, String> values = new HashMap<>();
      values.put("action", action);
      values.put("type", "statequery");
      // the message on a line of its own, as in a Python traceback (Spark appends SQLSTATE)
      values.put("msg", e.getMessage() + "\n");
      scala.collection.immutable.Map<String, String> params =
          scala.collection.immutable.Map$.MODULE$.from(
              scala.jdk.javaapi.CollectionConverters.asScala(values));
      throw DefaultSource.<RuntimeException>unchecked(
          new AnalysisException("PYTHON_DATA_SOURCE_ERROR", params, scala.Option.apply(e)));
    }
  }

  /** Spark's AnalysisException is a checked exception to Java; Scala code throws it freely. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E unchecked(Throwable e) throws E {
    throw (E) e;
  }
}
