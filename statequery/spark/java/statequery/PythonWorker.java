package statequery;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;

/**
 * A long-lived Python process running {@code statequery.spark.jvmworker}: it plans and reads for
 * this JVM. Workers are pooled per JVM and reused by later queries; one request at a time each.
 */
final class PythonWorker implements AutoCloseable {
  static final ObjectMapper JSON = new ObjectMapper();
  /** The frame protocol's version: statequery.spark.jvmworker.PROTOCOL. */
  static final int PROTOCOL = 1;
  private static final int MAX_IDLE = 8;
  private static final ArrayDeque<PythonWorker> IDLE = new ArrayDeque<>();
  private static volatile boolean hookAdded;

  final String python;
  private final Process process;
  final DataInputStream in;
  final DataOutputStream out;
  private boolean broken;

  private PythonWorker(String python) throws IOException {
    this.python = python;
    List<String> command = new ArrayList<>();
    command.add(python);
    command.add("-m");
    command.add("statequery.spark.jvmworker");
    ProcessBuilder builder = new ProcessBuilder(command);
    builder.redirectError(ProcessBuilder.Redirect.INHERIT);
    Map<String, String> env = builder.environment();
    String path = conf("spark.statequery.pythonpath", null);
    if (path != null && !path.isEmpty()) {
      String old = env.get("PYTHONPATH");
      env.put("PYTHONPATH", old == null || old.isEmpty() ? path : path + File.pathSeparator + old);
    }
    this.process = builder.start();
    this.in = new DataInputStream(new BufferedInputStream(process.getInputStream(), 1 << 16));
    this.out = new DataOutputStream(new BufferedOutputStream(process.getOutputStream(), 1 << 12));
    try {
      char kind = (char) in.readByte();
      byte[] payload = new byte[in.readInt()];
      in.readFully(payload);
      JsonNode hello = JSON.readTree(payload);
      if (kind != 'H' || hello.path("protocol").asInt(-1) != PROTOCOL) {
        throw new IOException("the statequery Python worker of " + python + " speaks protocol "
            + hello.path("protocol").asText("?") + " (statequery " + hello.path("statequery")
            .asText("?") + "), this jar " + PROTOCOL + ": use the jar that statequery builds "
            + "(statequery.spark.jvm.jar_path())");
      }
    } catch (IOException e) {
      process.destroy();
      if (e instanceof java.io.EOFException) {
        throw new IOException("the Python worker (" + python + " -m statequery.spark.jvmworker) "
            + "exited at start: is statequery installed for that Python? Its error is on this "
            + "JVM's standard error (an executor's log on a cluster)", e);
      }
      throw e;
    }
  }

  private static String conf(String key, String fallback) {
    SparkEnv env = SparkEnv.get();
    SparkConf conf = env == null ? null : env.conf();
    return conf == null ? fallback : conf.get(key, fallback);
  }

  /** The Python this JVM's workers run: spark.statequery.python, PySpark's, or python3. */
  static String pythonExecutable() {
    String python = conf("spark.statequery.python", null);
    if (python == null) {
      python = conf("spark.pyspark.python", null);
    }
    if (python == null) {
      python = System.getenv("PYSPARK_PYTHON");
    }
    return python == null || python.isEmpty() ? "python3" : python;
  }

  /** An idle worker, or a new one. */
  static PythonWorker take() {
    String python = pythonExecutable();
    synchronized (IDLE) {
      while (!IDLE.isEmpty()) {
        PythonWorker w = IDLE.pollFirst();
        if (w.python.equals(python) && w.process.isAlive()) {
          return w;
        }
        w.destroy();
      }
    }
    addHook();
    try {
      return new PythonWorker(python);
    } catch (IOException e) {
      throw new StatequeryException(
          "could not start the statequery Python worker with " + python + " (set "
              + "spark.statequery.python or spark.pyspark.python to a Python with statequery): "
              + e.getMessage(), e);
    }
  }

  private static void addHook() {
    if (hookAdded) {
      return;
    }
    synchronized (IDLE) {
      if (hookAdded) {
        return;
      }
      Runtime.getRuntime().addShutdownHook(new Thread(() -> {
        synchronized (IDLE) {
          for (PythonWorker w : IDLE) {
            w.destroy();
          }
          IDLE.clear();
        }
      }, "statequery-workers-shutdown"));
      hookAdded = true;
    }
  }

  /** Back to the pool (or ended, when a request failed half-way). */
  @Override
  public void close() {
    if (broken || !process.isAlive()) {
      destroy();
      return;
    }
    synchronized (IDLE) {
      if (IDLE.size() < MAX_IDLE) {
        IDLE.addFirst(this);
        return;
      }
    }
    destroy();
  }

  void markBroken() {
    broken = true;
  }

  private void destroy() {
    try {
      out.close();
    } catch (IOException ignored) {
      // the worker exits when its standard input closes
    }
    process.destroy();
  }

  void send(char kind, byte[] payload) throws IOException {
    out.writeByte(kind);
    out.writeInt(payload.length);
    out.write(payload);
    out.flush();
  }

  void sendByte(char b) throws IOException {
    out.writeByte(b);
    out.flush();
  }

  /** One request with a JSON answer; a Python error raises {@link StatequeryException}. */
  JsonNode call(char kind, Object request) {
    try {
      send(kind, JSON.writeValueAsBytes(request));
      char got = (char) in.readByte();
      byte[] payload = new byte[in.readInt()];
      in.readFully(payload);
      if (got == 'E') {
        throw StatequeryException.fromPython(JSON.readTree(payload));
      }
      if (got != 'J') {
        throw new IOException("unexpected frame " + got + " from the statequery Python worker");
      }
      return JSON.readTree(payload);
    } catch (IOException e) {
      broken = true;
      throw new StatequeryException(
          "the statequery Python worker (" + python + ") failed: " + e, e);
    }
  }

  /** Run one request on a pooled worker. */
  static JsonNode request(char kind, Object request) {
    try (PythonWorker w = take()) {
      return w.call(kind, request);
    }
  }

  static String text(byte[] payload) {
    return new String(payload, StandardCharsets.UTF_8);
  }
}
