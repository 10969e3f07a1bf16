package statequery.serve;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The password check of {@code statequery serve}'s Thrift JDBC server
 * ({@code hive.server2.authentication=CUSTOM}): a client's password must be the server's token,
 * which the server generated at start, wrote to its 0600 {@code server.token} file and gave its
 * JVM in the environment variable {@code SPARK_CONNECT_AUTHENTICATE_TOKEN} (the one Spark
 * Connect checks too). The user name is not checked: whoever can read the token file can act
 * as the server's user anyway. Without the variable every client is refused.
 */
public final class TokenAuthenticator implements PasswdAuthenticationProvider {
  /** Where the JVM finds the token (the variable Spark Connect reads too). */
  public static final String TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN";

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String token = System.getenv(TOKEN_ENV);
    if (token == null || token.isEmpty()) {
      throw new AuthenticationException("statequery serve: the server has no token; refused");
    }
    byte[] given = (password == null ? "" : password).getBytes(StandardCharsets.UTF_8);
    if (!MessageDigest.isEqual(token.getBytes(StandardCharsets.UTF_8), given)) {
      throw new AuthenticationException(
          "statequery serve: wrong or missing token (the password is the content of the "
              + "server's server.token file)");
    }
  }
}
