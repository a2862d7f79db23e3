package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import herald.stomp.Stomp.Frame;
import herald.stomp.Stomp.Session;
import herald.stomp.Stomp.Subscribed;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.messaging.simp.stomp.StompHeaders;

/**
 * herald's STOMP over WebSocket ({@code docs/stomp.md}) with Spring's {@code WebSocketStompClient},
 * unchanged, as a Spring back end uses it: CONNECT with and without a token, text and binary
 * SEND and MESSAGE byte for byte, herald's HTTP publish reaching a Spring subscriber, receipts,
 * client-individual acknowledgement with credit, ERROR frames in the session handler, and
 * heart-beats both ways. Every wait is bounded ({@link Stomp#STEP}).
 */
@Timeout(60)
class SpringStompTest {
    /** herald beats every second, so that a test can watch heart-beats in a few seconds. */
    static final String CONFIG = "[limits]\nping_interval_secs = 1\n";

    /** Every byte value, and NULs where a frame without content-length would end. */
    static final byte[] BINARY = binary();

    static Herald herald;
    static Herald secured;
    /** Spring clients that beat every second both ways, as herald offers. */
    static Stomp stomp;

    @BeforeAll
    static void start() throws Exception {
        herald = Herald.open(CONFIG);
        secured = Herald.secured(CONFIG);
        stomp = new Stomp(1000, 1000);
    }

    @AfterAll
    static void stop() throws Exception {
        Herald.closeAll(stomp, herald, secured);
    }

    private static byte[] binary() {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (int i = 0; i < 256; i++) {
            out.write(i);
        }
        out.writeBytes(new byte[] {0, 0, 'e', 'n', 'd', 0});
        return out.toByteArray();
    }

    static Session connect(Herald server, String passcode) throws Exception {
        StompHeaders connect = new StompHeaders();
        if (passcode != null) {
            connect.setLogin("spring-app"); // herald reads the token in passcode only
            connect.setPasscode(passcode);
        }
        return stomp.connect(server.stompUrl(), connect);
    }

    static StompHeaders send(Session s, String destination, String contentType, byte[] body) throws Exception {
        return Stomp.receipt(s.session.send(headers(destination, contentType), body));
    }

    static StompHeaders headers(String destination, String contentType) {
        StompHeaders h = new StompHeaders();
        h.setDestination(destination);
        if (contentType != null) {
            h.set(StompHeaders.CONTENT_TYPE, contentType);
        }
        return h;
    }

    static String text(Frame f) {
        return new String(f.body(), StandardCharsets.UTF_8);
    }

    @Test
    void connectedSaysVersionServerSessionAndTheNegotiatedHeartBeats() throws Exception {
        Session s = connect(herald, null);
        assertEquals("1.2", s.connected.getFirst("version"));
        assertTrue(s.connected.getFirst("server").startsWith("herald/"), s.connected.toString());
        assertNotNull(s.connected.getFirst("session"));
        assertArrayEquals(new long[] {1000, 1000}, s.connected.getHeartbeat());
        // Idle for longer than Spring waits for herald's beats (3 of its intervals) and than
        // herald waits for Spring's (2 intervals): both sides kept beating.
        Subscribed sub = s.subscribe("/topic/java/beat");
        Thread.sleep(3500);
        assertTrue(s.session.isConnected() && s.transportErrors.isEmpty(), s.transportErrors.toString());
        herald.publishHttp("java/beat", "alive".getBytes(StandardCharsets.UTF_8), "text/plain");
        assertEquals("alive", text(sub.inbox().next()));
        s.disconnect();
    }

    @Test
    void textAndBinaryBodiesArriveByteForByteInOrder() throws Exception {
        Session sub = connect(herald, null);
        Session pub = connect(herald, null);
        Subscribed s = sub.subscribe("/topic/java/bin", "id", "s-bin");
        byte[] image = new byte[200_000]; // larger than one Tomcat buffer by default (8 KiB)
        new Random(7).nextBytes(image);
        image[0] = 0;
        image[image.length - 1] = 0;
        byte[] text = "text é, ünïcödé".getBytes(StandardCharsets.UTF_8);
        send(pub, "/topic/java/bin", "application/octet-stream", BINARY);
        send(pub, "/topic/java/bin", "text/plain;charset=UTF-8", text);
        // Spring sends a frame as a binary WebSocket message only for this content type; any
        // other it decodes as UTF-8 into a text message, which changes a binary body.
        send(pub, "/topic/java/bin", "application/octet-stream", image);

        List<Frame> got = s.inbox().next(3);
        assertArrayEquals(BINARY, got.get(0).body());
        assertArrayEquals(text, got.get(1).body());
        assertArrayEquals(image, got.get(2).body());
        String[] types = {"application/octet-stream", "text/plain;charset=UTF-8", "application/octet-stream"};
        int[] lengths = {BINARY.length, text.length, image.length};
        long seq = Long.parseLong(got.get(0).header("seq"));
        for (int i = 0; i < 3; i++) {
            Frame f = got.get(i);
            assertEquals("s-bin", f.header("subscription"));
            assertEquals("/topic/java/bin", f.header("destination"));
            assertEquals(types[i], f.header("content-type"));
            assertEquals(lengths[i], Integer.parseInt(f.header("content-length")));
            assertEquals(seq + i, Long.parseLong(f.header("seq")));
            assertEquals(got.get(0).header("epoch"), f.header("epoch"));
            assertNotNull(f.header("message-id"));
        }
        s.inbox().quiet();
        sub.disconnect();
        pub.disconnect();
    }

    @Test
    void heraldsHttpPublishAndSpringSendsReachASpringSubscriberOnceInOrder() throws Exception {
        Session sub = connect(herald, null);
        Session pub = connect(herald, null);
        Subscribed s = sub.subscribe("/topic/java/cross");
        List<byte[]> sent = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            byte[] body;
            if (i % 2 == 0) {
                body = (i % 4 == 0) ? ("http text " + i).getBytes(StandardCharsets.UTF_8) : concat(BINARY, i);
                herald.publishHttp("java/cross", body, i % 4 == 0 ? "text/plain" : "application/octet-stream");
            } else {
                body = concat(BINARY, i);
                send(pub, "/topic/java/cross", "application/octet-stream", body);
            }
            sent.add(body);
        }
        List<Frame> got = s.inbox().next(sent.size());
        for (int i = 0; i < sent.size(); i++) {
            assertArrayEquals(sent.get(i), got.get(i).body(), "message " + i);
            assertEquals(i + 1, Long.parseLong(got.get(i).header("seq")));
        }
        s.inbox().quiet();
        sub.disconnect();
        pub.disconnect();
    }

    private static byte[] concat(byte[] a, int last) {
        byte[] out = java.util.Arrays.copyOf(a, a.length + 1);
        out[a.length] = (byte) last;
        return out;
    }

    @Test
    void receiptsSayWhatASubscribeRecovered() throws Exception {
        herald.publishHttp("java/receipt", "before".getBytes(StandardCharsets.UTF_8), "text/plain");
        Session sub = connect(herald, null);
        Subscribed s = sub.subscribe("/topic/java/receipt", "snapshot", "true");
        assertNotNull(s.receipt().getFirst("cursor"), s.receipt().toString());
        // The topic's last value (snapshot:true), counted with what a SUBSCRIBE replays.
        assertEquals("1", s.receipt().getFirst("replayed"), s.receipt().toString());
        assertEquals("before", text(s.inbox().next()));
        Stomp.receipt(s.subscription().unsubscribe()); // once it arrives, nothing more comes
        herald.publishHttp("java/receipt", "after".getBytes(StandardCharsets.UTF_8), "text/plain");
        s.inbox().quiet();
        sub.disconnect();
    }

    @Test
    void clientIndividualAcksGiveCreditBack() throws Exception {
        Session sub = connect(herald, null);
        Session pub = connect(herald, null);
        Subscribed s = sub.subscribe("/topic/java/credit", "ack", "client-individual", "prefetch-count", "2");
        for (int i = 0; i < 5; i++) {
            // No wait for the RECEIPT: herald holds the publish while the subscriber has no credit.
            pub.session.send(headers("/topic/java/credit", "text/plain"), ("m" + i).getBytes(StandardCharsets.UTF_8));
        }
        List<Frame> got = new ArrayList<>(s.inbox().next(2));
        s.inbox().quiet(); // out of credit: the rest wait in herald
        Stomp.receipt(sub.session.acknowledge(got.get(0).header("ack"), true));
        got.add(s.inbox().next());
        s.inbox().quiet();
        // A NACK gives its credit back too (herald does not redeliver).
        Stomp.receipt(sub.session.acknowledge(got.get(1).header("ack"), false));
        got.add(s.inbox().next());
        s.inbox().quiet();
        Stomp.receipt(sub.session.acknowledge(got.get(2).header("ack"), true));
        Stomp.receipt(sub.session.acknowledge(got.get(3).header("ack"), true));
        got.add(s.inbox().next());
        s.inbox().quiet();
        List<String> bodies = got.stream().map(SpringStompTest::text).toList();
        assertEquals(List.of("m0", "m1", "m2", "m3", "m4"), bodies);
        for (Frame f : got) {
            assertTrue(f.header("ack").startsWith(f.header("subscription") + ":"), f.headers().toString());
        }
        sub.disconnect();
        pub.disconnect();
    }

    @Test
    void aRefusedDestinationIsAnErrorInTheSessionHandlerThenTheClose() throws Exception {
        Session s = connect(herald, null);
        StompHeaders h = headers("/queue/jobs", "text/plain");
        h.setReceipt("to-a-queue");
        s.session.send(h, "job".getBytes(StandardCharsets.UTF_8));
        Frame error = s.next();
        assertTrue(error.header("message").contains("topics only"), error.headers().toString());
        assertEquals("to-a-queue", error.header("receipt-id"));
        s.lost();
    }

    @Test
    void aTokenInPasscodeConnectsAndItsGrantsApply() throws Exception {
        Session sub = connect(secured, secured.token("--sub", "java/auth/>"));
        Session pub = connect(secured, secured.token("--pub", "java/auth/>"));
        Subscribed s = sub.subscribe("/topic/java/auth/a");
        send(pub, "/topic/java/auth/a", "application/octet-stream", BINARY);
        assertArrayEquals(BINARY, s.inbox().next().body());

        // Beyond the token's grants: an ERROR naming the refusal and the frame's receipt.
        StompHeaders wider = new StompHeaders();
        wider.setDestination("/topic/java/other");
        wider.setReceipt("too-wide");
        sub.session.subscribe(wider, new Stomp.Inbox());
        Frame error = sub.next();
        assertTrue(error.header("message").startsWith("forbidden"), error.headers().toString());
        assertEquals("too-wide", error.header("receipt-id"));
        sub.lost();
        pub.disconnect();
    }

    @Test
    void aMissingOrBadPasscodeIsAnErrorBeforeConnected() throws Exception {
        for (String passcode : new String[] {null, "not-a-token"}) {
            StompHeaders connect = new StompHeaders();
            if (passcode != null) {
                connect.setPasscode(passcode);
            }
            Session s = stomp.refused(secured.stompUrl(), connect);
            Frame error = s.next();
            assertNotNull(error.header("message"), error.headers().toString());
            assertTrue(s.connected == null);
        }
    }
}
