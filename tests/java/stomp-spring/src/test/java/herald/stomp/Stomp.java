package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.fail;

import jakarta.websocket.ContainerProvider;
import jakarta.websocket.WebSocketContainer;
import java.lang.reflect.Type;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import org.springframework.messaging.MessageDeliveryException;
import org.springframework.messaging.simp.stomp.StompCommand;
import org.springframework.messaging.simp.stomp.StompFrameHandler;
import org.springframework.messaging.simp.stomp.StompHeaders;
import org.springframework.messaging.simp.stomp.StompSession;
import org.springframework.messaging.simp.stomp.StompSessionHandler;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;
import org.springframework.web.socket.WebSocketHttpHeaders;
import org.springframework.web.socket.client.standard.StandardWebSocketClient;
import org.springframework.web.socket.messaging.WebSocketStompClient;

/**
 * Spring's {@link WebSocketStompClient} on Tomcat's JSR-356 client, set up as a Spring back end
 * sets it up, and the bounded waits the tests need around its callbacks.
 */
final class Stomp implements AutoCloseable {
    /** Seconds allowed for any single network step. */
    static final long STEP = 5;
    /** Milliseconds of silence taken to mean that nothing more is coming. */
    static final long QUIET_MS = 500;
    /** The largest WebSocket message either side may send; Tomcat's default is 8 KiB. */
    static final int MAX_MESSAGE = 1 << 20;

    final WebSocketStompClient client;
    private final ThreadPoolTaskScheduler scheduler = new ThreadPoolTaskScheduler();

    /** A client whose sessions offer to send a heart-beat every {@code sendEvery} ms and to
     * receive one every {@code receiveEvery} ms (the CONNECT header {@code heart-beat}); over
     * {@code wss://} it trusts what the JVM's trust store trusts. */
    Stomp(long sendEvery, long receiveEvery) {
        this(sendEvery, receiveEvery, null);
    }

    /** As {@link #Stomp(long, long)}, but over {@code wss://} it trusts what {@code tls} trusts
     * ({@code null}: the JVM's trust store). */
    Stomp(long sendEvery, long receiveEvery, SSLContext tls) {
        WebSocketContainer container = ContainerProvider.getWebSocketContainer();
        container.setDefaultMaxBinaryMessageBufferSize(MAX_MESSAGE);
        container.setDefaultMaxTextMessageBufferSize(MAX_MESSAGE);
        StandardWebSocketClient webSocket = new StandardWebSocketClient(container);
        if (tls != null) {
            webSocket.setSslContext(tls); // Tomcat's client takes it from the endpoint config
        }
        client = new WebSocketStompClient(webSocket);
        client.setInboundMessageSizeLimit(MAX_MESSAGE);
        scheduler.setPoolSize(2);
        scheduler.setThreadNamePrefix("stomp-heart-beat-");
        scheduler.initialize();
        client.setTaskScheduler(scheduler);
        client.setDefaultHeartbeat(new long[] {sendEvery, receiveEvery});
        client.setReceiptTimeLimit(TimeUnit.SECONDS.toMillis(STEP));
    }

    /** Connects to {@code url}; waits for CONNECTED. */
    Session connect(String url, StompHeaders connect) throws Exception {
        Session s = new Session();
        s.session = client.connectAsync(url, new WebSocketHttpHeaders(), connect, s)
                .get(STEP, TimeUnit.SECONDS);
        s.connected = s.whenConnected.get(STEP, TimeUnit.SECONDS);
        s.session.setAutoReceipt(true);
        return s;
    }

    /** Connects to {@code url}, which must refuse the CONNECT: returns the session handler,
     * which saw the ERROR. */
    Session refused(String url, StompHeaders connect) throws Exception {
        Session s = new Session();
        CompletableFuture<StompSession> f = client.connectAsync(url, new WebSocketHttpHeaders(), connect, s);
        try {
            f.get(STEP, TimeUnit.SECONDS);
            fail("the CONNECT was accepted");
        } catch (java.util.concurrent.ExecutionException expected) {
            // Spring fails the future when herald closes after its ERROR.
        }
        return s;
    }

    /** Connects to {@code url}, which must fail before any STOMP frame (in the TCP, TLS or
     * WebSocket handshake): returns why. */
    Throwable unreachable(String url) throws Exception {
        Session s = new Session();
        CompletableFuture<StompSession> f = client.connectAsync(url, new WebSocketHttpHeaders(), new StompHeaders(), s);
        try {
            f.get(STEP, TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException expected) {
            return expected.getCause();
        }
        throw new AssertionError("connected to " + url);
    }

    @Override
    public void close() {
        client.stop();
        scheduler.shutdown();
    }

    /** One received frame: its headers, and its body as bytes (empty for none). */
    record Frame(StompHeaders headers, byte[] body) {
        String header(String name) {
            return headers.getFirst(name);
        }
    }

    /** Waits for the RECEIPT of {@code r} and returns its headers. */
    static StompHeaders receipt(StompSession.Receiptable r) throws Exception {
        assertNotNull(r.getReceiptId(), "no receipt asked for");
        CompletableFuture<StompHeaders> got = new CompletableFuture<>();
        r.addReceiptTask(got::complete);
        r.addReceiptLostTask(() -> got.completeExceptionally(
                new AssertionError("no RECEIPT " + r.getReceiptId() + " within the time limit")));
        return got.get(STEP + 1, TimeUnit.SECONDS);
    }

    /** Frames delivered to one handler, for the test thread to wait on. */
    static class Inbox implements StompFrameHandler {
        private final BlockingQueue<Frame> frames = new LinkedBlockingQueue<>();

        @Override
        public Type getPayloadType(StompHeaders headers) {
            return byte[].class;
        }

        @Override
        public void handleFrame(StompHeaders headers, Object payload) {
            frames.add(new Frame(headers, payload == null ? new byte[0] : (byte[]) payload));
        }

        /** The next frame; fails after {@link #STEP} seconds. */
        Frame next() throws InterruptedException {
            Frame f = frames.poll(STEP, TimeUnit.SECONDS);
            if (f == null) {
                fail("no frame within " + STEP + " s");
            }
            return f;
        }

        List<Frame> next(int n) throws InterruptedException {
            List<Frame> got = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                got.add(next());
            }
            return got;
        }

        /** Nothing more arrives for {@link #QUIET_MS}. */
        void quiet() throws InterruptedException {
            Frame f = frames.poll(QUIET_MS, TimeUnit.MILLISECONDS);
            assertNull(f, () -> "unexpected frame " + f.headers());
        }
    }

    /** A session and what its session handler saw: ERROR frames (with the same body
     * conversion as messages) and transport errors. */
    static final class Session extends Inbox implements StompSessionHandler {
        StompSession session;
        /** CONNECTED's headers; {@code null} for a refused CONNECT. */
        StompHeaders connected;
        final List<Throwable> transportErrors = new CopyOnWriteArrayList<>();
        /** Spring completes the connect future before it calls {@link #afterConnected}. */
        private final CompletableFuture<StompHeaders> whenConnected = new CompletableFuture<>();
        private final CompletableFuture<Throwable> lost = new CompletableFuture<>();

        @Override
        public void afterConnected(StompSession session, StompHeaders connectedHeaders) {
            whenConnected.complete(connectedHeaders);
        }

        @Override
        public void handleException(StompSession s, StompCommand command, StompHeaders headers,
                byte[] payload, Throwable exception) {
            transportErrors.add(exception);
        }

        @Override
        public void handleTransportError(StompSession s, Throwable exception) {
            transportErrors.add(exception);
            lost.complete(exception);
        }

        /** Waits until the connection is lost: Spring told the handler why, and the session
         * is no longer connected. */
        void lost() throws Exception {
            assertNotNull(lost.get(STEP, TimeUnit.SECONDS));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(STEP);
            while (session.isConnected()) {
                if (System.nanoTime() > deadline) {
                    fail("still connected after " + transportErrors);
                }
                Thread.sleep(10);
            }
        }

        /** Sends DISCONNECT. Spring sends its heart-beats from a scheduler thread on the same
         * Tomcat endpoint, which refuses a second send while one is being written
         * ({@code TEXT_PARTIAL_WRITING}): a DISCONNECT that meets a heart-beat is sent again
         * once that is out. */
        void disconnect() throws InterruptedException {
            for (int attempt = 1; ; attempt++) {
                try {
                    session.disconnect();
                    return;
                } catch (MessageDeliveryException e) {
                    if (attempt == 3 || !(e.getCause() instanceof IllegalStateException)) {
                        throw e;
                    }
                    Thread.sleep(20);
                }
            }
        }

        /** A subscription to {@code destination} with {@code extra} headers (name, value, …),
         * in place once this returns (its RECEIPT arrived); the RECEIPT's headers in
         * {@code receipt}. */
        Subscribed subscribe(String destination, String... extra) throws Exception {
            StompHeaders h = new StompHeaders();
            h.setDestination(destination);
            for (int i = 0; i < extra.length; i += 2) {
                h.add(extra[i], extra[i + 1]);
            }
            Inbox inbox = new Inbox();
            StompSession.Subscription sub = session.subscribe(h, inbox);
            return new Subscribed(sub, inbox, receipt(sub));
        }
    }

    record Subscribed(StompSession.Subscription subscription, Inbox inbox, StompHeaders receipt) {}
}
