package statequery;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Columnar readers of one scan: the pickled reader, the columns read. */
final class StatequeryReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final byte[] reader;
  private final String[] columns;
  private final String readSchemaJson;

  StatequeryReaderFactory(byte[] reader, String[] columns, String readSchemaJson) {
    this.reader = reader;
    this.columns = columns;
    this.readSchemaJson = readSchemaJson;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("statequery reads columnar batches only");
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    return new ColumnarReader(reader, (StatequeryPartition) partition, columns, readSchemaJson);
  }
}
