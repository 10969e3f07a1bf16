package statequery;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads one partition: a pooled Python worker decodes it and streams Arrow record batches of the
 * columns asked for (or row counts when none is), a few ahead of this reader.
 */
final class ColumnarReader implements PartitionReader<ColumnarBatch> {
  /** Batches a worker may send ahead of this reader: few (a LIMIT drains them), many for
   *  row counts (no column read: a few bytes each). The pipe holds back the rest. */
  private static final int AHEAD = 4;
  private static final int AHEAD_COUNTS = 256;
  private static final ColumnVector[] NO_COLUMNS = new ColumnVector[0];

  private final PythonWorker worker;
  private final BufferAllocator allocator;
  private Schema schema;
  private VectorSchemaRoot root;
  private ColumnarBatch batch;
  private boolean ended;
  private boolean released;

  ColumnarReader(
      byte[] reader, StatequeryPartition partition, String[] columns, String readSchemaJson) {
    allocator = ArrowUtils.rootAllocator().newChildAllocator(
        "statequery partition " + partition.index, 0, Long.MAX_VALUE);
    worker = PythonWorker.take();
    try {
      Map<String, Object> request = new HashMap<>();
      Base64.Encoder b64 = Base64.getEncoder();
      request.put("reader", b64.encodeToString(reader));
      request.put("partition", b64.encodeToString(partition.pickled));
      request.put("columns", columns);
      request.put("schema", columns.length == 0 ? "" : readSchemaJson);
      worker.send('R', PythonWorker.JSON.writeValueAsBytes(request));
      char kind = (char) worker.in.readByte();
      byte[] payload = new byte[worker.in.readInt()];
      worker.in.readFully(payload);
      if (kind == 'E') {
        ended = true;
        worker.sendByte('C');
        throw StatequeryException.fromPython(PythonWorker.JSON.readTree(payload));
      }
      if (kind != 'A') {
        throw new IOException("unexpected frame " + kind);
      }
      if (payload.length > 0) {
        schema = MessageSerializer.deserializeSchema(channel(payload));
      }
      int ahead = columns.length == 0 ? AHEAD_COUNTS : AHEAD;
      for (int i = 0; i < ahead; i++) {
        worker.out.writeByte('N');
      }
      worker.out.flush();
    } catch (IOException e) {
      fail(e);
    } catch (RuntimeException e) {
      close();
      throw e;
    }
  }

  private static ReadChannel channel(byte[] payload) {
    return new ReadChannel(Channels.newChannel(new ByteArrayInputStream(payload)));
  }

  private void fail(IOException e) {
    worker.markBroken();
    ended = true;
    close();
    throw new StatequeryException("the statequery Python worker failed: " + e, e);
  }

  @Override
  public boolean next() {
    if (ended) {
      return false;
    }
    try {
      char kind = (char) worker.in.readByte();
      int length = worker.in.readInt();
      switch (kind) {
        case 'B': {
          byte[] payload = new byte[length];
          worker.in.readFully(payload);
          worker.sendByte('N');
          // new vectors for each batch: Spark may close a batch's columns (and an Arrow struct
          // vector loses its children when closed); the previous batch is done with by now
          closeRoot();
          root = VectorSchemaRoot.create(schema, allocator);
          try (ArrowRecordBatch rb =
              MessageSerializer.deserializeRecordBatch(channel(payload), allocator)) {
            new VectorLoader(root).load(rb);
          }
          List<FieldVector> vectors = root.getFieldVectors();
          ColumnVector[] columns = new ColumnVector[vectors.size()];
          for (int i = 0; i < columns.length; i++) {
            columns[i] = new ArrowColumnVector(vectors.get(i));
          }
          batch = new ColumnarBatch(columns, root.getRowCount());
          return true;
        }
        case 'K': {
          long rows = worker.in.readLong();
          worker.sendByte('N');
          batch = new ColumnarBatch(NO_COLUMNS, (int) rows);
          return true;
        }
        case 'Z':
          skip(length);
          ended = true;
          worker.sendByte('C');
          release();
          return false;
        case 'E': {
          byte[] payload = new byte[length];
          worker.in.readFully(payload);
          ended = true;
          worker.sendByte('C');
          release();
          throw StatequeryException.fromPython(PythonWorker.JSON.readTree(payload));
        }
        default:
          throw new IOException("unexpected frame " + kind);
      }
    } catch (IOException e) {
      fail(e);
      return false;
    }
  }

  private void skip(int length) throws IOException {
    worker.in.readFully(new byte[length]);
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  private void release() {
    if (!released) {
      released = true;
      worker.close();
    }
  }

  @Override
  public void close() {
    if (!ended) {
      // stopped early (a LIMIT): tell the worker, skip what it sent ahead
      ended = true;
      try {
        worker.sendByte('C');
        while (true) {
          char kind = (char) worker.in.readByte();
          int length = worker.in.readInt();
          skip(length);
          if (kind == 'Z' || kind == 'E') {
            break;
          }
        }
      } catch (IOException e) {
        worker.markBroken();
      }
    }
    release();
    closeRoot();
    allocator.close();
  }

  private void closeRoot() {
    if (root != null) {
      root.close();
      root = null;
    }
  }
}
