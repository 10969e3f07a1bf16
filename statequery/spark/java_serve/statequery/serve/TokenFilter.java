package statequery.serve;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Base64;

/**
 * The login of {@code statequery serve --ui}'s Spark UI ({@code spark.ui.filters}): HTTP Basic,
 * any user name, the server's token as the password (the environment variable
 * {@code SPARK_CONNECT_AUTHENTICATE_TOKEN} of the JVM, as for Connect and the Thrift server).
 * Anything else gets 401. Without the variable every request is refused.
 */
public final class TokenFilter implements Filter {
  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
      throws IOException, ServletException {
    String token = System.getenv(TokenAuthenticator.TOKEN_ENV);
    String header = ((HttpServletRequest) request).getHeader("Authorization");
    if (token != null && !token.isEmpty() && header != null
        && header.regionMatches(true, 0, "Basic ", 0, 6)) {
      String decoded;
      try {
        decoded = new String(Base64.getDecoder().decode(header.substring(6).trim()),
            StandardCharsets.UTF_8);
      } catch (IllegalArgumentException e) {
        decoded = "";
      }
      int colon = decoded.indexOf(':');
      byte[] given = (colon < 0 ? "" : decoded.substring(colon + 1))
          .getBytes(StandardCharsets.UTF_8);
      if (MessageDigest.isEqual(token.getBytes(StandardCharsets.UTF_8), given)) {
        chain.doFilter(request, response);
        return;
      }
    }
    HttpServletResponse http = (HttpServletResponse) response;
    http.setHeader("WWW-Authenticate",
        "Basic realm=\"statequery serve (password: the server.token file)\"");
    http.sendError(HttpServletResponse.SC_UNAUTHORIZED);
  }
}
