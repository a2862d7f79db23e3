package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * One {@code herald serve} process on a free loopback port, started from the binary that
 * {@code HERALD_BIN} (or the system property {@code herald.bin}) names, stopped with SIGTERM and
 * required to exit 0. With {@link #secured} it authenticates tokens signed with a secret of its
 * own, which {@link #token} mints through {@code herald token}; with {@link #tls} it speaks only
 * TLS, with a self-signed {@link #certificate} of its own ({@code https://}, {@code wss://}).
 */
final class Herald implements AutoCloseable {
    /** Seconds for herald to become healthy, and to exit after SIGTERM. */
    static final long STARTUP_SECONDS = 10;

    final int port;
    /** herald's TLS certificate; {@code null} without TLS. */
    final Certificate certificate;
    private final Path dir;
    private final Path log;
    private final Path secret;
    private final HttpClient http;
    private final Process process;

    private Herald(String config, boolean secured, boolean tls) throws Exception {
        dir = Files.createTempDirectory("herald-spring-");
        log = dir.resolve("herald.log");
        Path toml = dir.resolve("herald.toml");
        Files.writeString(toml, config);
        port = freePort();
        List<String> command = new ArrayList<>(List.of(
                bin(), "serve", "--listen", "127.0.0.1:" + port, "--config", toml.toString()));
        if (secured) {
            byte[] key = new byte[32];
            new java.security.SecureRandom().nextBytes(key);
            secret = dir.resolve("secret");
            Files.writeString(secret, Base64.getEncoder().encodeToString(key) + "\n");
            command.addAll(List.of("--auth-hs256-secret-file", secret.toString()));
        } else {
            secret = null;
        }
        HttpClient.Builder client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(3));
        if (tls) {
            certificate = Certificate.selfSigned(dir);
            command.addAll(List.of("--tls-cert-file", certificate.cert().toString(),
                    "--tls-key-file", certificate.key().toString()));
            client.sslContext(certificate.trustingIt());
        } else {
            certificate = null;
        }
        http = client.build();
        process = new ProcessBuilder(command)
                .redirectErrorStream(true)
                .redirectOutput(log.toFile())
                .start();
        waitHealthy();
    }

    /** herald with auth off and {@code config} as its TOML. */
    static Herald open(String config) throws Exception {
        return new Herald(config, false, false);
    }

    /** herald with auth on (HS256 tokens) and {@code config} as its TOML. */
    static Herald secured(String config) throws Exception {
        return new Herald(config, true, false);
    }

    /** herald with TLS on its listener (a self-signed certificate), auth off and {@code config}
     * as its TOML. */
    static Herald tls(String config) throws Exception {
        return new Herald(config, false, true);
    }

    private static String bin() {
        String bin = System.getProperty("herald.bin", System.getenv("HERALD_BIN"));
        if (bin == null || !Files.isExecutable(Path.of(bin))) {
            fail("no herald binary at HERALD_BIN=" + bin
                    + ": run `cargo build --release -p herald` and set HERALD_BIN (scripts/test does)");
        }
        return bin;
    }

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    private void waitHealthy() throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(STARTUP_SECONDS);
        IOException last = null;
        while (System.nanoTime() < deadline) {
            if (!process.isAlive()) {
                fail("herald exited early (" + process.exitValue() + "):\n" + output());
            }
            try {
                HttpRequest get = HttpRequest.newBuilder(URI.create(http("/healthz")))
                        .timeout(Duration.ofSeconds(1))
                        .build();
                if (http.send(get, HttpResponse.BodyHandlers.discarding()).statusCode() == 200) {
                    return;
                }
            } catch (IOException notYet) {
                last = notYet; // not listening yet, or (with TLS) a certificate the client refuses
            }
            Thread.sleep(50);
        }
        process.destroyForcibly();
        fail("herald did not answer /healthz within " + STARTUP_SECONDS + " s (last: " + last + "):\n" + output());
    }

    String http(String path) {
        return (certificate == null ? "http" : "https") + "://127.0.0.1:" + port + path;
    }

    /** The STOMP over WebSocket endpoint. */
    String stompUrl() {
        return (certificate == null ? "ws" : "wss") + "://127.0.0.1:" + port + "/stomp";
    }

    /** {@code POST /api/publish/{topic}}: herald's own HTTP publish; returns the status. */
    int publishHttp(String topic, byte[] body, String contentType) throws Exception {
        HttpRequest post = HttpRequest.newBuilder(URI.create(http("/api/publish/" + topic)))
                .timeout(Duration.ofSeconds(3))
                .header("Content-Type", contentType)
                .POST(HttpRequest.BodyPublishers.ofByteArray(body))
                .build();
        HttpResponse<String> r = http.send(post, HttpResponse.BodyHandlers.ofString());
        assertEquals(200, r.statusCode(), r.body());
        return r.statusCode();
    }

    /** A token from {@code herald token} with this server's secret and the given grant flags,
     * e.g. {@code token("--sub", "java/>", "--pub", "java/>")}. */
    String token(String... grants) throws Exception {
        if (secret == null) {
            throw new IllegalStateException("this herald does not authenticate");
        }
        List<String> command = new ArrayList<>(List.of(
                bin(), "token", "--secret-file", secret.toString(), "--ttl", "600"));
        command.addAll(List.of(grants));
        Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
        if (!p.waitFor(STARTUP_SECONDS, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            fail("herald token did not finish");
        }
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
        assertEquals(0, p.exitValue(), out);
        return out;
    }

    String output() {
        try {
            String all = Files.readString(log);
            return all.substring(Math.max(0, all.length() - 4000));
        } catch (IOException e) {
            return "(no log: " + e + ")";
        }
    }

    /** SIGTERM; herald must exit 0 within {@link #STARTUP_SECONDS}. */
    @Override
    public void close() throws Exception {
        try {
            process.destroy();
            if (!process.waitFor(STARTUP_SECONDS, TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor(STARTUP_SECONDS, TimeUnit.SECONDS);
                fail("herald did not exit within " + STARTUP_SECONDS + " s of SIGTERM:\n" + output());
            }
            assertEquals(0, process.exitValue(), "herald's exit code after SIGTERM:\n" + output());
        } finally {
            try (Stream<Path> files = Files.walk(dir)) {
                files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }

    /** Closes, in order, each of {@code them} that was opened (a test class's {@code @AfterAll}:
     * a {@code @BeforeAll} that failed leaves some null), every one even if an earlier one
     * fails; throws the first failure, the later ones suppressed in it. */
    static void closeAll(AutoCloseable... them) throws Exception {
        Exception first = null;
        for (AutoCloseable it : them) {
            if (it == null) {
                continue;
            }
            try {
                it.close();
            } catch (Exception e) {
                if (first == null) {
                    first = e;
                } else {
                    first.addSuppressed(e);
                }
            }
        }
        if (first != null) {
            throw first;
        }
    }
}
