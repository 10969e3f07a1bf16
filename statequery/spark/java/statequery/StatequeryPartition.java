package statequery;

import org.apache.spark.sql.connector.read.InputPartition;

/** One partition of the Python data source's plan, pickled (opaque to the JVM). */
final class StatequeryPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final int index;
  final byte[] pickled;

  StatequeryPartition(int index, byte[] pickled) {
    this.index = index;
    this.pickled = pickled;
  }
}
