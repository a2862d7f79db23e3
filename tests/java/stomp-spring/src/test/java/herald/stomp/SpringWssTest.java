package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import herald.stomp.Stomp.Frame;
import herald.stomp.Stomp.Session;
import herald.stomp.Stomp.Subscribed;
import java.io.EOFException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Random;
import javax.net.ssl.SSLException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.messaging.simp.stomp.StompHeaders;

/**
 * Spring's {@code WebSocketStompClient} over {@code wss://} to a herald with {@code [tls]}
 * ({@code docs/stomp.md}, TLS): a client that trusts herald's (self-signed) certificate through
 * the {@code SSLContext} of its {@code StandardWebSocketClient} subscribes and sends, and the
 * bodies arrive byte for byte; a client that does not trust it, or that speaks plain
 * {@code ws://}, does not connect.
 */
@Timeout(60)
class SpringWssTest {
    static Herald herald;
    /** Spring clients that trust herald's certificate. */
    static Stomp trusting;

    @BeforeAll
    static void start() throws Exception {
        herald = Herald.tls(SpringStompTest.CONFIG);
        trusting = new Stomp(1000, 1000, herald.certificate.trustingIt());
    }

    @AfterAll
    static void stop() throws Exception {
        Herald.closeAll(trusting, herald);
    }

    @Test
    void aClientTrustingHeraldsCertificateSubscribesAndSendsOverWss() throws Exception {
        assertTrue(herald.stompUrl().startsWith("wss://"), herald.stompUrl());
        Session sub = trusting.connect(herald.stompUrl(), new StompHeaders());
        Session pub = trusting.connect(herald.stompUrl(), new StompHeaders());
        assertEquals("1.2", sub.connected.getFirst("version"));
        Subscribed s = sub.subscribe("/topic/java/wss", "id", "s-wss");
        byte[] image = new byte[200_000]; // many TLS records (at most 16 KiB each)
        new Random(11).nextBytes(image);
        byte[] text = "über TLS".getBytes(StandardCharsets.UTF_8);
        byte[] viaHttps = "via https".getBytes(StandardCharsets.UTF_8);
        SpringStompTest.send(pub, "/topic/java/wss", "application/octet-stream", SpringStompTest.BINARY);
        SpringStompTest.send(pub, "/topic/java/wss", "application/octet-stream", image);
        SpringStompTest.send(pub, "/topic/java/wss", "text/plain;charset=UTF-8", text);
        herald.publishHttp("java/wss", viaHttps, "text/plain");

        List<byte[]> sent = List.of(SpringStompTest.BINARY, image, text, viaHttps);
        List<Frame> got = s.inbox().next(sent.size());
        for (int i = 0; i < sent.size(); i++) {
            Frame f = got.get(i);
            assertArrayEquals(sent.get(i), f.body(), "message " + i);
            assertEquals(sent.get(i).length, Integer.parseInt(f.header("content-length")));
            assertEquals("s-wss", f.header("subscription"));
            assertEquals(i + 1, Long.parseLong(f.header("seq")));
        }
        s.inbox().quiet();
        assertTrue(sub.transportErrors.isEmpty() && pub.transportErrors.isEmpty(),
                sub.transportErrors + " " + pub.transportErrors);
        sub.disconnect();
        pub.disconnect();
    }

    @Test
    void aClientThatDoesNotTrustTheCertificateFailsItsTlsHandshake() throws Exception {
        Stomp jvmTrust = new Stomp(1000, 1000);
        try {
            Throwable why = jvmTrust.unreachable(herald.stompUrl());
            assertTrue(causes(why, SSLException.class), () -> "not a TLS failure: " + trace(why));
        } finally {
            jvmTrust.close();
        }
    }

    @Test
    void plainWsToATlsHeraldDoesNotConnect() throws Exception {
        String plain = herald.stompUrl().replaceFirst("^wss://", "ws://");
        Throwable why = trusting.unreachable(plain);
        // herald closes without an HTTP answer: it never answers in plain text.
        assertTrue(causes(why, EOFException.class), () -> "not closed unanswered: " + trace(why));
    }

    private static boolean causes(Throwable t, Class<? extends Throwable> kind) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (kind.isInstance(c)) {
                return true;
            }
        }
        return false;
    }

    private static String trace(Throwable t) {
        java.io.StringWriter out = new java.io.StringWriter();
        t.printStackTrace(new java.io.PrintWriter(out));
        return out.toString();
    }
}
