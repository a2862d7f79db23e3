package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import herald.stomp.Stomp.Frame;
import herald.stomp.Stomp.Session;
import herald.stomp.Stomp.Subscribed;
import java.nio.charset.StandardCharsets;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.messaging.simp.stomp.StompHeaders;

/**
 * A Spring client resuming a subscription after a reconnect, as {@code docs/stomp.md} (Recovery)
 * tells one to: it remembers the {@code seq} and {@code epoch} of the last MESSAGE, and
 * SUBSCRIBEs again with {@code since:<seq>@<epoch>} and a {@code receipt}. herald replays exactly
 * what was published meanwhile, in order and once, then the live messages; the RECEIPT's
 * {@code replayed} counts the replay, and its {@code gap} says what could not be recovered and
 * why (absent when nothing was missed).
 */
@Timeout(60)
class SpringRecoveryTest {
    /** Topics under {@code java/trim/} keep 3 messages of history; others the usual 32. */
    static final String CONFIG = """
            [[history]]
            pattern = "java/trim/>"
            max_messages = 3

            [[history]]
            pattern = ">"
            """;

    static Herald herald;
    static Stomp stomp;
    /** The session that publishes while subscribers are away. */
    static Session publisher;

    @BeforeAll
    static void start() throws Exception {
        herald = Herald.open(CONFIG);
        stomp = new Stomp(1000, 1000);
        publisher = stomp.connect(herald.stompUrl(), new StompHeaders());
    }

    @AfterAll
    static void stop() throws Exception {
        Herald.closeAll(stomp, herald);
    }

    /** Publishes {@code body} on {@code topic}, accepted once this returns: through herald's
     * HTTP publish for an even {@code n}, a Spring SEND for an odd one. */
    static void publish(String topic, int n, String body) throws Exception {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        if (n % 2 == 0) {
            herald.publishHttp(topic, bytes, "text/plain");
        } else {
            SpringStompTest.send(publisher, "/topic/" + topic, "text/plain", bytes);
        }
    }

    /** Publishes {@code prefix + n} for each n in [from, to]. */
    static void publishRange(String topic, String prefix, int from, int to) throws Exception {
        for (int n = from; n <= to; n++) {
            publish(topic, n, prefix + n);
        }
    }

    /** The {@code since} value that resumes after {@code f}. */
    static String position(Frame f) {
        return f.header("seq") + "@" + f.header("epoch");
    }

    /** Subscribes on a fresh connection to {@code /topic/<topic>}, receives the messages
     * {@code prefix + n} for n in [1, last] published now, and disconnects: the last one. */
    static Frame receiveThenLeave(String topic, String prefix, int last) throws Exception {
        Session away = stomp.connect(herald.stompUrl(), new StompHeaders());
        Subscribed s = away.subscribe("/topic/" + topic, "id", "resume");
        publishRange(topic, prefix, 1, last);
        List<Frame> got = s.inbox().next(last);
        assertBodies(got, prefix, 1);
        away.disconnect();
        return got.get(last - 1);
    }

    /** {@code frames} are {@code prefix + n} with {@code seq} n, for n from {@code first} on. */
    static void assertBodies(List<Frame> frames, String prefix, int first) {
        for (int i = 0; i < frames.size(); i++) {
            Frame f = frames.get(i);
            assertEquals(prefix + (first + i), SpringStompTest.text(f), f.headers().toString());
            assertEquals(first + i, Long.parseLong(f.header("seq")), f.headers().toString());
        }
    }

    /** A subscription made with {@code since} on a new connection: the session, where further
     * messages arrive, and the replayed messages. */
    record Resumed(Session session, Stomp.Inbox inbox, List<Frame> replay) {}

    /** Reconnects and SUBSCRIBEs to {@code /topic/<topic>} with {@code since} and a receipt; the
     * RECEIPT must say {@code replayed} and {@code gap} ({@code null}: none), then that many
     * messages must arrive. */
    static Resumed resume(String topic, String since, int replayed, String gap) throws Exception {
        Session back = stomp.connect(herald.stompUrl(), new StompHeaders());
        Subscribed s = back.subscribe("/topic/" + topic, "id", "resume", "since", since);
        StompHeaders receipt = s.receipt();
        assertEquals(String.valueOf(replayed), receipt.getFirst("replayed"), receipt.toString());
        assertEquals(gap, receipt.getFirst("gap"), receipt.toString());
        assertNotNull(receipt.getFirst("cursor"), receipt.toString());
        return new Resumed(back, s.inbox(), s.inbox().next(replayed));
    }

    @Test
    void sinceTheLastMessageReplaysExactlyWhatWasMissedThenLiveMessagesFollow() throws Exception {
        Frame last = receiveThenLeave("java/resume", "m", 3);
        publishRange("java/resume", "m", 4, 8); // while the subscriber is away

        Resumed back = resume("java/resume", position(last), 5, null); // no gap: nothing missed
        assertBodies(back.replay(), "m", 4);
        for (Frame f : back.replay()) {
            assertEquals(last.header("epoch"), f.header("epoch"));
            assertEquals("resume", f.header("subscription"));
        }
        publish("java/resume", 9, "m9");
        assertBodies(List.of(back.inbox().next()), "m", 9);
        back.inbox().quiet(); // no message twice
        back.session().disconnect();
    }

    @Test
    void anEpochHeraldDoesNotHaveIsAGapNamingItsEpochAndEverythingHeldIsReplayed() throws Exception {
        String epoch = receiveThenLeave("java/epoch", "e", 3).header("epoch");

        Resumed back = resume("java/epoch", "2@not-" + epoch, 3,
                "/topic/java/epoch history lost, numbering restarted in epoch " + epoch);
        assertBodies(back.replay(), "e", 1);
        back.inbox().quiet();
        back.session().disconnect();
    }

    @Test
    void messagesHistoryNoLongerHoldsAreAGapAndTheRestIsReplayed() throws Exception {
        Frame last = receiveThenLeave("java/trim/a", "t", 2);
        publishRange("java/trim/a", "t", 3, 8); // history keeps 6, 7 and 8

        Resumed back = resume("java/trim/a", position(last), 3, "/topic/java/trim/a 3-5 no longer held");
        assertBodies(back.replay(), "t", 6);
        back.inbox().quiet();
        back.session().disconnect();
    }

    @Test
    void aTopicHeraldHoldsNothingOfIsAGapAndOnlyLiveMessagesFollow() throws Exception {
        String epoch = receiveThenLeave("java/known", "k", 1).header("epoch");

        Resumed back = resume("java/never", "4@" + epoch, 0, "/topic/java/never nothing held");
        back.inbox().quiet();
        publish("java/never", 1, "n1");
        assertBodies(List.of(back.inbox().next()), "n", 1);
        back.session().disconnect();
    }
}
