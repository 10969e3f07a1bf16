package statequery;

import com.fasterxml.jackson.databind.JsonNode;

/** An error of the statequery Python code, raised in the JVM with its Python type and message. */
public class StatequeryException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String pythonType;

  StatequeryException(String message, Throwable cause) {
    super(message, cause);
    this.pythonType = null;
  }

  StatequeryException(String pythonType, String message) {
    super(pythonType + ": " + message);
    this.pythonType = pythonType;
  }

  static StatequeryException fromPython(JsonNode error) {
    return new StatequeryException(error.path("type").asText("Exception"),
        error.path("message").asText(""));
  }

  /** The Python exception's qualified name (e.g. statequery.exceptions.InvalidOptionError). */
  public String pythonType() {
    return pythonType;
  }
}
