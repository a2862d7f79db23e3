use super::*;
use crate::codec::{Encode, Frame};
use crate::test_support::frame_json;
use crate::wire::{decode_text, Native};
use bytes::Bytes;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// Collects what the engine sends to one connection, encoded as herald's protocol encodes it.
#[derive(Clone, Default)]
struct Inbox(Rc<RefCell<Vec<Frame>>>);

impl Inbox {
    fn send(&self, frame: Frame) {
        self.0.borrow_mut().push(frame);
    }
}

impl Outbox for Inbox {
    fn reply(&self, reply: &Reply) {
        self.send(Native.reply(reply));
    }
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        self.send(Native.dropped(topic, count, reason));
    }
    fn deliver(&self, message: &Message, _: &Delivery) {
        self.send(Native.frame(message));
    }
    fn recovered(&self, message: &Message) {
        self.send(Native.frame(message));
    }
    fn snapshot(&self, pattern: &str, count: usize) {
        self.send(
            Native
                .snapshot(pattern, count)
                .expect("herald's protocol announces it"),
        );
    }
}

impl Inbox {
    fn take(&self) -> Vec<Value> {
        self.0
            .borrow_mut()
            .drain(..)
            .map(|f| frame_json(&f))
            .collect()
    }
    fn frames(&self) -> Vec<Frame> {
        self.0.borrow_mut().drain(..).collect()
    }
}

fn engine() -> Engine<Inbox> {
    Engine::new(EngineConfig::default(), 1)
}

fn client(e: &mut Engine<Inbox>) -> (ConnId, Inbox) {
    let inbox = Inbox::default();
    (e.connect(inbox.clone()), inbox)
}

fn req(
    e: &mut Engine<Inbox>,
    conn: ConnId,
    json: &str,
    now: u64,
) -> Result<Option<Published>, &'static str> {
    e.handle(conn, decode_text(json).unwrap(), now)
}

/// A plain text publish of `data` on `topic`.
pub(super) fn text(topic: &str, data: &str) -> Publish {
    Publish {
        id: None,
        topic: topic.into(),
        payload: Bytes::copy_from_slice(data.as_bytes()),
        kind: PayloadKind::Text,
        content_type: None,
        stamp: false,
        extras: None,
    }
}

fn publish(e: &mut Engine<Inbox>, topic: &str, data: &str) -> Published {
    e.publish(&text(topic, data), 1_000).unwrap()
}

fn data(msgs: &[Value]) -> Vec<&str> {
    msgs.iter()
        .filter(|m| m["op"] == "msg")
        .map(|m| m["data"].as_str().unwrap())
        .collect()
}

#[test]
fn overlapping_patterns_deliver_once_per_connection_in_order() {
    let mut e = engine();
    let (a, inbox_a) = client(&mut e);
    let (b, inbox_b) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"quotes/*/EURUSD"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"sub","topic":"quotes/>"}"#, 0).unwrap();
    req(&mut e, b, r#"{"op":"sub","topic":"quotes/fx/>"}"#, 0).unwrap();
    inbox_a.take();
    inbox_b.take();
    for i in 0..5 {
        let p = publish(&mut e, "quotes/fx/EURUSD", &i.to_string());
        assert_eq!(p.deliveries, 2);
    }
    publish(&mut e, "quotes/eq/IBM", "x");
    let a_msgs = inbox_a.take();
    assert_eq!(data(&a_msgs), ["0", "1", "2", "3", "4", "x"]);
    assert_eq!(data(&inbox_b.take()), ["0", "1", "2", "3", "4"]);
    let seqs: Vec<u64> = a_msgs
        .iter()
        .take(5)
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

#[test]
fn a_no_local_subscription_does_not_bring_back_the_connections_own_messages() {
    let mut e = engine();
    let (a, inbox_a) = client(&mut e);
    let (b, inbox_b) = client(&mut e);
    let no_local = |topic: &str| {
        Request::Subscribe(Subscribe {
            topic: topic.into(),
            no_local: true,
            ..Subscribe::default()
        })
    };
    e.handle(a, no_local("t/>"), 0).unwrap();
    e.handle(b, no_local("t/>"), 0).unwrap();
    inbox_a.take();
    inbox_b.take();
    assert_eq!(
        e.publish_from(a, &text("t/x", "1"), 0).unwrap().deliveries,
        1
    );
    assert_eq!(data(&inbox_a.take()), Vec::<&str>::new());
    assert_eq!(data(&inbox_b.take()), ["1"]);
    // Another matching subscription without the option keeps its own messages coming, once.
    req(&mut e, a, r#"{"op":"sub","topic":"t/x"}"#, 0).unwrap();
    inbox_a.take();
    e.publish_from(a, &text("t/x", "2"), 0).unwrap();
    e.publish_from(a, &text("t/y", "3"), 0).unwrap();
    assert_eq!(data(&inbox_a.take()), ["2"]);
    // Others' messages come as usual; and without the option again, so do its own.
    e.publish_from(b, &text("t/y", "4"), 0).unwrap();
    assert_eq!(data(&inbox_a.take()), ["4"]);
    req(&mut e, a, r#"{"op":"sub","topic":"t/>"}"#, 0).unwrap();
    inbox_a.take();
    e.publish_from(a, &text("t/y", "5"), 0).unwrap();
    assert_eq!(data(&inbox_a.take()), ["5"]);
}

#[test]
fn every_subscriber_gets_the_same_bytes() {
    let mut e = engine();
    let (a, inbox_a) = client(&mut e);
    let (b, inbox_b) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t"}"#, 0).unwrap();
    req(&mut e, b, r#"{"op":"sub","topic":">"}"#, 0).unwrap();
    inbox_a.frames();
    inbox_b.frames();
    publish(&mut e, "t", "hello");
    let (fa, fb) = (inbox_a.frames().remove(0), inbox_b.frames().remove(0));
    assert_eq!(fa.head.as_ptr(), fb.head.as_ptr(), "one shared encoding");
}

#[test]
fn subscribe_replies_and_errors_carry_the_id() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","id":"s1","topic":"a/*"}"#, 0).unwrap();
    assert_eq!(
        inbox.take(),
        [
            json!({"op":"subscribed","id":"s1","topic":"a/*","recovered":true,"replayed":0,
            "cursor":e.cursor()})
        ]
    );
    assert_eq!(
        req(&mut e, a, r#"{"op":"sub","id":2,"topic":"a//b"}"#, 0),
        Err("invalid_topic")
    );
    assert_eq!(
        req(
            &mut e,
            a,
            r#"{"op":"pub","id":3,"topic":"a/*","data":"x"}"#,
            0
        ),
        Err("publish_to_pattern")
    );
    assert_eq!(
        req(&mut e, a, r#"{"op":"unsub","id":4,"topic":"b"}"#, 0),
        Err("not_subscribed")
    );
    let errors = inbox.take();
    assert_eq!(
        errors.iter().map(|v| v["id"].clone()).collect::<Vec<_>>(),
        [json!(2), json!(3), json!(4)]
    );
    assert!(errors
        .iter()
        .all(|v| v["op"] == "error" && v["message"].as_str().unwrap().len() > 10));
    assert!(
        errors[1]["message"].as_str().unwrap().contains("a/*"),
        "{}",
        errors[1]
    );
}

#[test]
fn publish_with_id_is_acknowledged_with_its_sequence_number() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"pub","topic":"x/y","data":"1"}"#, 0).unwrap();
    req(
        &mut e,
        a,
        r#"{"op":"pub","id":7,"topic":"x/y","data":"2"}"#,
        0,
    )
    .unwrap();
    assert_eq!(
        inbox.take(),
        [json!({"op":"ack","id":7,"topic":"x/y","seq":2})]
    );
}

#[test]
fn unsubscribe_stops_delivery() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t/>"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"unsub","id":1,"topic":"t/>"}"#, 0).unwrap();
    assert_eq!(
        inbox.take()[1],
        json!({"op":"unsubscribed","id":1,"topic":"t/>"})
    );
    assert_eq!(publish(&mut e, "t/1", "x").deliveries, 0);
    assert_eq!(e.subscription_count(), 0);
}

#[test]
fn subscription_limit_is_enforced_and_resubscribing_is_idempotent() {
    let config = EngineConfig {
        max_subscriptions_per_connection: 2,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"a"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"sub","topic":"a"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"sub","topic":"b"}"#, 0).unwrap();
    assert_eq!(
        req(&mut e, a, r#"{"op":"sub","topic":"c"}"#, 0),
        Err("too_many_subscriptions")
    );
    assert_eq!(e.subscription_count(), 2);
    inbox.take();
    assert_eq!(publish(&mut e, "a", "x").deliveries, 1);
    assert_eq!(data(&inbox.take()), ["x"]);
}

#[test]
fn trim_gives_back_the_subscription_lists_spare_room_and_keeps_every_subscription() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    for i in 0..100 {
        req(&mut e, a, &format!(r#"{{"op":"sub","topic":"t/{i}"}}"#), 0).unwrap();
    }
    let room = |e: &Engine<_>| e.conn(a).unwrap().subs.capacity();
    assert!(room(&e) > 100, "grown by doubling");
    e.trim(a);
    assert_eq!(room(&e), 100);
    inbox.take();
    for i in [0, 57, 99] {
        assert_eq!(publish(&mut e, &format!("t/{i}"), "x").deliveries, 1);
    }
    assert_eq!(data(&inbox.take()), ["x", "x", "x"]);
}

#[test]
fn disconnect_removes_subscriptions_and_reuses_the_slot() {
    let mut e = engine();
    let (a, _) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":">"}"#, 0).unwrap();
    assert!(e.disconnect(a).is_some());
    assert!(e.disconnect(a).is_none());
    assert_eq!((e.subscription_count(), e.connection_count()), (0, 0));
    assert_eq!(publish(&mut e, "t", "x").deliveries, 0);
    let (b, _) = client(&mut e);
    assert_eq!(b, a);
}

#[test]
fn snapshot_delivers_last_values_after_the_reply() {
    let mut e = engine();
    publish(&mut e, "q/a", "1");
    publish(&mut e, "q/a", "2");
    publish(&mut e, "q/b", "3");
    publish(&mut e, "r/c", "4");
    let (a, inbox) = client(&mut e);
    req(
        &mut e,
        a,
        r#"{"op":"sub","id":1,"topic":"q/*","snapshot":true}"#,
        0,
    )
    .unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["op"], "subscribed");
    assert_eq!(got[0]["replayed"], 2);
    assert_eq!(data(&got), ["2", "3"]);
    assert_eq!(got[1]["seq"], 2);
    req(
        &mut e,
        a,
        r#"{"op":"sub","topic":"r/c","snapshot":true}"#,
        0,
    )
    .unwrap();
    assert_eq!(data(&inbox.take()), ["4"]);
}

#[test]
fn expired_messages_are_neither_replayed_nor_a_snapshot() {
    let config = EngineConfig {
        history: vec![HistoryRule {
            pattern: ">".into(),
            ..HistoryRule::default()
        }],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let expiring = |data: &str, expires_us| Publish {
        extras: Some(std::sync::Arc::new(crate::extras::Extras {
            expires_us: Some(expires_us),
            ..Default::default()
        })),
        ..text("t", data)
    };
    e.publish(&text("t", "1"), 1_000).unwrap();
    e.publish(&expiring("2", 5_000), 1_000).unwrap();
    e.publish(&expiring("3", 9_000), 1_000).unwrap();
    let (a, inbox) = client(&mut e);
    let replay = r#"{"op":"sub","topic":"t","cursor":"x"}"#;
    req(&mut e, a, replay, 4_999).unwrap();
    assert_eq!(data(&inbox.take()), ["1", "2", "3"]);
    req(&mut e, a, replay, 5_000).unwrap();
    let got = inbox.take();
    assert_eq!(data(&got), ["1", "3"]);
    assert_eq!(got[0]["recovered"], true, "an expired message is no gap");
    req(
        &mut e,
        a,
        r#"{"op":"sub","topic":"t","snapshot":true}"#,
        8_999,
    )
    .unwrap();
    assert_eq!(data(&inbox.take()), ["3"]);
    req(
        &mut e,
        a,
        r#"{"op":"sub","topic":"t","snapshot":true}"#,
        9_000,
    )
    .unwrap();
    assert_eq!(data(&inbox.take()), Vec::<&str>::new());
}

#[test]
fn recovery_replays_exactly_what_was_missed() {
    let mut e = engine();
    for i in 1..=10 {
        publish(&mut e, "t", &i.to_string());
    }
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t","snapshot":true}"#, 0).unwrap();
    let epoch = inbox.take()[1]["epoch"].as_str().unwrap().to_owned();
    let since = format!(
        r#"{{"op":"sub","id":1,"topic":"t","since":{{"t":{{"seq":7,"epoch":"{epoch}"}}}}}}"#
    );
    let (b, inbox_b) = client(&mut e);
    req(&mut e, b, &since, 0).unwrap();
    let got = inbox_b.take();
    assert_eq!(
        got[0],
        json!({"op":"subscribed","id":1,"topic":"t","recovered":true,"replayed":3,
            "cursor":e.cursor()})
    );
    assert_eq!(data(&got), ["8", "9", "10"]);
    // Then live messages follow without a gap.
    publish(&mut e, "t", "11");
    assert_eq!(inbox_b.take()[0]["seq"], 11);
}

#[test]
fn recovery_reports_trimmed_history_and_changed_epochs() {
    let rule = HistoryRule {
        pattern: ">".into(),
        max_messages: 3,
        ..HistoryRule::default()
    };
    let config = EngineConfig {
        history: vec![rule],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    for i in 1..=10 {
        publish(&mut e, "t/a", &i.to_string());
    }
    publish(&mut e, "t/b", "b1");
    let (a, inbox) = client(&mut e);
    let since = r#"{"t/a":{"seq":2,"epoch":"EPOCH"},"t/b":{"seq":5,"epoch":"old"},"t/zz":{"seq":1,"epoch":"old"}}"#;
    let epoch_a = {
        req(
            &mut e,
            a,
            r#"{"op":"sub","topic":"t/a","snapshot":true}"#,
            0,
        )
        .unwrap();
        inbox.take()[1]["epoch"].as_str().unwrap().to_owned()
    };
    let (b, inbox_b) = client(&mut e);
    let request = format!(
        r#"{{"op":"sub","topic":"t/>","since":{}}}"#,
        since.replace("EPOCH", &epoch_a)
    );
    req(&mut e, b, &request, 0).unwrap();
    let got = inbox_b.take();
    let epoch_b = got.last().unwrap()["epoch"].clone();
    assert_eq!(
        got[0],
        json!({"op":"subscribed","topic":"t/>","recovered":false,"replayed":4,"gaps":[
            {"topic":"t/a","reason":"history_trimmed","from":3,"to":7},
            {"topic":"t/b","reason":"epoch_changed","epoch":epoch_b},
            {"topic":"t/zz","reason":"unknown_topic"}],"cursor":e.cursor()})
    );
    assert_eq!(data(&got), ["8", "9", "10", "b1"]);
}

#[test]
fn history_is_trimmed_by_bytes_and_age() {
    let rule = HistoryRule {
        pattern: "big/>".into(),
        max_messages: 100,
        max_bytes: 300,
        max_age_secs: 10,
    };
    let config = EngineConfig {
        history: vec![rule],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let body = "x".repeat(60);
    for _ in 0..10 {
        publish(&mut e, "big/t", &body); // ~125 bytes per frame
    }
    let (a, inbox) = client(&mut e);
    let epoch = {
        req(
            &mut e,
            a,
            r#"{"op":"sub","topic":"big/t","snapshot":true}"#,
            0,
        )
        .unwrap();
        inbox.take()[1]["epoch"].as_str().unwrap().to_owned()
    };
    let since = |seq: u64| {
        format!(
            r#"{{"op":"sub","topic":"big/t","since":{{"big/t":{{"seq":{seq},"epoch":"{epoch}"}}}}}}"#
        )
    };
    req(&mut e, a, &since(0), 1_000).unwrap();
    let got = inbox.take();
    assert_eq!(
        got[0]["gaps"][0]["to"], 8,
        "only 2 frames fit in 300 bytes: {}",
        got[0]
    );
    // 11 s later everything has aged out, but the last value stays for snapshots.
    req(&mut e, a, &since(0), 1_000 + 11_000_000).unwrap();
    assert_eq!(inbox.take()[0]["replayed"], 0);
    req(
        &mut e,
        a,
        r#"{"op":"sub","topic":"big/t","snapshot":true}"#,
        1_000 + 11_000_000,
    )
    .unwrap();
    assert_eq!(inbox.take()[0]["replayed"], 1);
    // Topics that no rule matches keep only their last value.
    publish(&mut e, "other", "1");
    publish(&mut e, "other", "2");
    let (b, inbox_b) = client(&mut e);
    req(
        &mut e,
        b,
        &format!(
            r#"{{"op":"sub","topic":"other","since":{{"other":{{"seq":0,"epoch":"{}"}}}}}}"#,
            "?"
        ),
        0,
    )
    .unwrap();
    assert_eq!(inbox_b.take()[0]["recovered"], false);
}

#[test]
fn since_must_name_topics_the_pattern_matches() {
    let mut e = engine();
    let (a, _) = client(&mut e);
    assert_eq!(
        req(
            &mut e,
            a,
            r#"{"op":"sub","topic":"a/*","since":{"b/c":{"seq":1,"epoch":"x"}}}"#,
            0
        ),
        Err("invalid_topic")
    );
    assert_eq!(
        e.subscription_count(),
        0,
        "a refused subscribe leaves nothing behind"
    );
}

#[test]
fn stamp_adds_the_receive_time_and_content_type_travels() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t"}"#, 0).unwrap();
    req(
        &mut e,
        a,
        r#"{"op":"pub","topic":"t","data":"x","stamp":true,"ct":"text/csv"}"#,
        123_456,
    )
    .unwrap();
    let msg = inbox.take().pop().unwrap();
    assert_eq!(
        (msg["ts"].clone(), msg["ct"].clone()),
        (json!(123_456), json!("text/csv"))
    );
}

#[test]
fn binary_payloads_are_delivered_unchanged_and_oversize_is_refused() {
    let config = EngineConfig {
        max_message_bytes: 1000,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"cam"}"#, 0).unwrap();
    inbox.take();
    let payload: Vec<u8> = (0..=255).collect();
    let p = Publish {
        id: None,
        topic: "cam".into(),
        payload: Bytes::from(payload.clone()),
        kind: PayloadKind::Binary,
        content_type: Some("image/fits".into()),
        stamp: false,
        extras: None,
    };
    e.publish(&p, 0).unwrap();
    let msg = inbox.take().pop().unwrap();
    assert_eq!(msg["payload"], json!(payload));
    assert_eq!(msg["ct"], "image/fits");
    let big = Publish {
        payload: Bytes::from(vec![0; 1001]),
        ..p
    };
    assert_eq!(e.publish(&big, 0).unwrap_err().code, "message_too_large");
}

#[test]
fn epochs_differ_between_seeds_and_topics() {
    let mut e1 = Engine::<Inbox>::new(EngineConfig::default(), 1);
    let mut e2 = Engine::<Inbox>::new(EngineConfig::default(), 2);
    let epoch = |e: &mut Engine<Inbox>, t: &str| e.topic_state(t).head.epoch().to_owned();
    let (a, b) = (epoch(&mut e1, "t"), epoch(&mut e2, "t"));
    assert_ne!(a, b);
    assert_ne!(epoch(&mut e1, "u"), a);
    assert_eq!(a.len(), 12);
}

#[test]
fn topics_view_counts_each_subscribing_connection_once() {
    let mut e = engine();
    let (a, _inbox_a) = client(&mut e);
    let (b, _inbox_b) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"q/*/x"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"sub","topic":"q/>"}"#, 0).unwrap();
    req(&mut e, b, r#"{"op":"sub","topic":"q/fx/x"}"#, 0).unwrap();
    publish(&mut e, "q/fx/x", "1");
    publish(&mut e, "q/fx/x", "2");
    publish(&mut e, "other", "o");
    let mut views: Vec<_> = e
        .topics_page("", None, usize::MAX)
        .map(|t| (t.name, t.seq, t.subscribers, t.history))
        .collect();
    views.sort();
    assert_eq!(views, [("other", 1, 0, 1), ("q/fx/x", 2, 2, 2)]);
    let view = e
        .topics_page("", None, usize::MAX)
        .find(|t| t.name == "q/fx/x")
        .unwrap();
    assert_eq!(
        frame_json(&Native.frame(&view.last().unwrap()))["data"],
        "2"
    );
    e.disconnect(b);
    let view = e
        .topics_page("", None, usize::MAX)
        .find(|t| t.name == "q/fx/x")
        .unwrap();
    assert_eq!(view.subscribers, 1);
}

#[test]
fn interest_is_reported_for_the_first_and_last_subscriber_of_a_pattern() {
    let mut e = engine();
    let (a, _) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"before"}"#, 0).unwrap();
    e.track_interest();
    assert_eq!(
        e.take_interest_changes(),
        vec![Interest::Added("before".into())]
    );
    let (b, _) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"x/>"}"#, 0).unwrap();
    req(&mut e, b, r#"{"op":"sub","topic":"x/>"}"#, 0).unwrap();
    req(&mut e, b, r#"{"op":"sub","topic":"x/>"}"#, 0).unwrap();
    assert_eq!(
        e.take_interest_changes(),
        vec![Interest::Added("x/>".into())]
    );
    req(&mut e, a, r#"{"op":"unsub","topic":"x/>"}"#, 0).unwrap();
    assert_eq!(e.take_interest_changes(), vec![]);
    e.disconnect(b);
    e.disconnect(a);
    assert_eq!(
        e.take_interest_changes(),
        vec![
            Interest::Removed("x/>".into()),
            Interest::Removed("before".into())
        ]
    );
}

fn remote(e: &mut Engine<Inbox>, topic: &str, epoch: &str, seq: u64) -> RemotePublished {
    let p = text(topic, &format!("{epoch}:{seq}"));
    e.publish_remote(&p, epoch, seq, 1_000).unwrap()
}

#[test]
fn remote_messages_keep_their_numbers_and_holes_are_reported() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t"}"#, 0).unwrap();
    inbox.take();
    assert_eq!(remote(&mut e, "t", "e1", 5).published.seq, 5);
    assert_eq!(remote(&mut e, "t", "e1", 6).missed, 0);
    assert_eq!(
        remote(&mut e, "t", "e1", 6).published.deliveries,
        0,
        "duplicate"
    );
    assert_eq!(remote(&mut e, "t", "e1", 9).missed, 2);
    let got = inbox.take();
    assert_eq!(data(&got), ["e1:5", "e1:6", "e1:9"]);
    assert_eq!(
        got[2],
        json!({"op":"dropped","topic":"t","count":2,"reason":"remote"})
    );
    assert_eq!(
        (got[3]["seq"].clone(), got[3]["epoch"].clone()),
        (json!(9), json!("e1"))
    );

    // A subscriber that joined after this node last heard of the topic missed nothing.
    let (late, inbox_late) = client(&mut e);
    req(&mut e, late, r#"{"op":"sub","topic":"t"}"#, 0).unwrap();
    inbox_late.take();
    assert_eq!(remote(&mut e, "t", "e1", 12).missed, 2);
    assert_eq!(
        inbox.take()[0],
        json!({"op":"dropped","topic":"t","count":2,"reason":"remote"})
    );
    assert_eq!(
        data(&inbox_late.take()),
        ["e1:12"],
        "no notice for the late subscriber"
    );

    // Recovery across the hole says so; after it, it is exact.
    let (b, inbox_b) = client(&mut e);
    let sub = r#"{"op":"sub","topic":"t","since":{"t":{"seq":5,"epoch":"e1"}}}"#;
    req(&mut e, b, sub, 0).unwrap();
    let got = inbox_b.take();
    assert_eq!(got[0]["gaps"][0]["reason"], "history_trimmed");
    assert_eq!(data(&got), ["e1:12"]);

    // A local publish on an adopted epoch starts an epoch of its own.
    let p = publish(&mut e, "t", "local");
    assert_eq!(p.seq, 1);
    assert_ne!(e.epoch_of("t"), Some("e1"));
    // And a remote message of another epoch is adopted again.
    assert_eq!(remote(&mut e, "t", "e2", 3).published.seq, 3);
    assert_eq!(e.epoch_of("t"), Some("e2"));
}

fn recalled(topic: &str, epoch: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Recalled> {
    seqs.map(|seq| Recalled {
        publish: text(topic, &format!("{epoch}:{seq}")),
        seq,
        at_us: 1_000,
    })
    .collect()
}

fn subscribe_since(e: &mut Engine<Inbox>, topic: &str, epoch: &str, seq: u64) -> Vec<Value> {
    let (c, inbox) = client(e);
    let sub = json!({"op":"sub","topic":topic,"since":{topic:{"seq":seq,"epoch":epoch}}});
    req(e, c, &sub.to_string(), 1_000).unwrap();
    inbox.take()
}

#[test]
fn what_memory_cannot_answer_is_named() {
    let mut e = engine();
    e.track_interest();
    let ask = |e: &Engine<Inbox>, json: &str| match decode_text(json).unwrap() {
        Request::Subscribe(s) => e.unanswered(&s),
        _ => unreachable!(),
    };
    let unknown = ask(
        &e,
        r#"{"op":"sub","topic":"t","since":{"t":{"seq":1,"epoch":"e1"}}}"#,
    );
    assert_eq!(unknown.since, ["t"]);
    remote(&mut e, "t", "e1", 5);
    remote(&mut e, "t", "e1", 6);
    let held = r#"{"op":"sub","topic":"t","since":{"t":{"seq":4,"epoch":"e1"}}}"#;
    assert!(ask(&e, held).is_empty(), "5 and 6 are held");
    let older = r#"{"op":"sub","topic":"t","since":{"t":{"seq":2,"epoch":"e1"}}}"#;
    assert_eq!(ask(&e, older).since, ["t"], "3 and 4 are not");
    let ahead = r#"{"op":"sub","topic":"t","since":{"t":{"seq":9,"epoch":"e1"}}}"#;
    assert_eq!(ask(&e, ahead).since, ["t"]);
    let other = r#"{"op":"sub","topic":"t","since":{"t":{"seq":2,"epoch":"e0"}}}"#;
    assert!(ask(&e, other).is_empty(), "epoch_changed is the answer");
    assert!(ask(&e, r#"{"op":"sub","topic":"t","snapshot":true}"#).is_empty());
    assert!(ask(&e, r#"{"op":"sub","topic":"u","snapshot":true}"#).snapshot);
    assert!(ask(&e, r#"{"op":"sub","topic":"*","snapshot":true}"#).snapshot);
}

#[test]
fn history_restored_from_a_store_joins_what_arrived_live() {
    let mut e = engine();
    // Nothing held: the store's messages become the history, under the origin's numbers.
    e.restore("a", "e1", recalled("a", "e1", 3..=5));
    let got = subscribe_since(&mut e, "a", "e1", 3);
    assert_eq!(got[0]["recovered"], true, "{got:?}");
    assert_eq!(data(&got), ["e1:4", "e1:5"]);
    assert_eq!(
        (got[2]["seq"].clone(), got[2]["epoch"].clone()),
        (json!(5), json!("e1"))
    );

    // Live messages arrived while the store was read: both join into one run.
    remote(&mut e, "b", "e1", 8);
    remote(&mut e, "b", "e1", 9);
    e.restore("b", "e1", recalled("b", "e1", 2..=8));
    let got = subscribe_since(&mut e, "b", "e1", 5);
    assert_eq!(got[0]["recovered"], true);
    assert_eq!(data(&got), ["e1:6", "e1:7", "e1:8", "e1:9"]);

    // A run that does not reach what is held is no use: the gap stays explicit.
    remote(&mut e, "c", "e1", 8);
    e.restore("c", "e1", recalled("c", "e1", 2..=5));
    let got = subscribe_since(&mut e, "c", "e1", 3);
    assert_eq!(got[0]["gaps"][0]["reason"], "history_trimmed");
    assert_eq!(data(&got), ["e1:8"]);

    // Another epoch held here is newer than the store: left alone.
    remote(&mut e, "d", "e2", 1);
    e.restore("d", "e1", recalled("d", "e1", 1..=5));
    assert_eq!(e.epoch_of("d"), Some("e2"));

    // The history rule still applies (default: 32 messages).
    e.restore("f", "e1", recalled("f", "e1", 1..=40));
    let got = subscribe_since(&mut e, "f", "e1", 0);
    assert_eq!(
        got[0]["gaps"][0],
        json!({"topic":"f","reason":"history_trimmed","from":1,"to":8})
    );
    assert_eq!(got.len(), 33);

    // And the last value is the newest message.
    let (c, inbox) = client(&mut e);
    req(&mut e, c, r#"{"op":"sub","topic":"b","snapshot":true}"#, 0).unwrap();
    assert_eq!(data(&inbox.take()), ["e1:9"]);
}

#[test]
fn topics_from_other_nodes_are_forgotten_when_no_longer_followed() {
    let mut e = engine();
    e.track_interest();
    let (a, _) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"x/>"}"#, 0).unwrap();
    req(&mut e, a, r#"{"op":"sub","topic":"x/a"}"#, 0).unwrap();
    remote(&mut e, "x/a", "e1", 1);
    remote(&mut e, "x/b", "e1", 1);
    publish(&mut e, "x/mine", "1");
    req(&mut e, a, r#"{"op":"unsub","topic":"x/>"}"#, 0).unwrap();
    assert_eq!(e.epoch_of("x/b"), None, "x/b would go stale");
    assert_eq!(e.epoch_of("x/a"), Some("e1"), "x/a is still followed");
    assert!(e.epoch_of("x/mine").is_some(), "this node numbers x/mine");
    // Held interest counts as following.
    e.hold_interest("x/a");
    req(&mut e, a, r#"{"op":"unsub","topic":"x/a"}"#, 0).unwrap();
    assert_eq!(e.epoch_of("x/a"), Some("e1"));
    e.release_interest("x/a");
    assert_eq!(e.epoch_of("x/a"), None);
}

#[test]
fn positions_announced_after_an_outage_reveal_holes_exactly() {
    let mut e = engine();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"t/>"}"#, 0).unwrap();
    remote(&mut e, "t/1", "e1", 4);
    publish(&mut e, "t/mine", "1");
    inbox.take();
    let mine = e.epoch_of("t/mine").unwrap().to_owned();
    assert_eq!(e.local_positions(), [("t/mine".into(), mine, 1)]);
    assert_eq!(e.remote_reached("t/1", "e1", 4), 0, "nothing missed");
    assert_eq!(
        e.remote_reached("t/1", "e2", 9),
        0,
        "another epoch says nothing of this one"
    );
    assert_eq!(e.remote_reached("t/unknown", "e1", 9), 0, "not followed");
    assert_eq!(e.remote_reached("t/1", "e1", 7), 3);
    assert_eq!(
        inbox.take(),
        [json!({"op":"dropped","topic":"t/1","count":3,"reason":"remote"})]
    );
    // The next message follows the hole without a second notice.
    assert_eq!(remote(&mut e, "t/1", "e1", 8).missed, 0);
    assert_eq!(data(&inbox.take()), ["e1:8"]);
}

/// A connection holding one subscription takes that subscription's policy without matching its
/// pattern again (the index found the connection through it): here, its lossless window.
#[test]
fn a_connections_only_subscription_sets_its_policy() {
    let mut e = engine();
    let (a, _inbox) = client(&mut e);
    let sub = r#"{"op":"sub","topic":"t/>","policy":"lossless","window":1}"#;
    req(&mut e, a, sub, 0).unwrap();
    assert!(!e.is_held("t/x", 1));
    publish(&mut e, "t/x", "1");
    assert!(e.is_held("t/x", 1), "its window of one message is spent");
}

/// A topic that keeps only its last value and has no subscriber keeps a message unencoded
/// (a discard need not encode): what a snapshot later sends must be, byte for byte, the frame
/// a subscriber would have been sent at the time.
#[test]
fn a_last_value_kept_unencoded_is_sent_as_it_would_have_been() {
    let config = EngineConfig {
        history: vec![HistoryRule::last_value_only(">")],
        ..EngineConfig::default()
    };
    let publishes = [
        text("t/plain", "1"),
        text("t/long", &"long ".repeat(40)),
        Publish {
            content_type: Some("text/csv".into()),
            stamp: true,
            ..text("t/typed", "a,\"b\"\n")
        },
        Publish {
            kind: PayloadKind::Binary,
            content_type: Some("image/fits".into()),
            payload: Bytes::from_static(&[0, 159, 146, 150]),
            ..text("t/binary", "")
        },
    ];
    // `live` has a subscriber on every topic when each message is published; `idle` has none
    // until afterwards. Both number the same topics in the same order, so epochs agree.
    let mut live = Engine::new(config.clone(), 7);
    let (watcher, sent) = client(&mut live);
    req(&mut live, watcher, r#"{"op":"sub","topic":">"}"#, 0).unwrap();
    sent.frames(); // the `subscribed` reply
    let mut idle = Engine::new(config, 7);
    for (i, p) in publishes.iter().enumerate() {
        let now = 1_000 + i as u64;
        assert_eq!(live.publish(p, now).unwrap().deliveries, 1);
        assert_eq!(idle.publish(p, now).unwrap().deliveries, 0);
    }
    for p in &publishes {
        let state = idle.topic_state(&p.topic);
        assert!(matches!(state.last, Some(Last::Unmade(_))), "{}", p.topic);
    }
    let (late, snapshot) = client(&mut idle);
    req(
        &mut idle,
        late,
        r#"{"op":"sub","topic":">","snapshot":true}"#,
        0,
    )
    .unwrap();
    let mut got = snapshot.frames();
    got.remove(0); // the `subscribed` reply
                   // A snapshot sends topics by name; they were published in another order.
    let sorted = |frames: Vec<Frame>| {
        let mut bytes: Vec<_> = frames.iter().map(Frame::to_vec).collect();
        bytes.sort();
        bytes
    };
    assert_eq!(sorted(got), sorted(sent.frames()));
    let view = idle
        .topics_page("", None, usize::MAX)
        .find(|t| t.name == "t/typed")
        .unwrap();
    assert_eq!(
        frame_json(&Native.frame(&view.last().unwrap()))["ct"],
        "text/csv"
    );
}

/// A text payload is a slice of the read that brought it (its frame's bytes): a last value kept
/// unencoded keeps a copy, in the topic's state when small, or one quiet topic would keep a
/// whole read buffer alive.
#[test]
fn a_last_value_kept_unencoded_holds_no_part_of_the_read() {
    let mut e: Engine<Inbox> = Engine::new(
        EngineConfig {
            history: vec![HistoryRule::last_value_only(">")],
            ..EngineConfig::default()
        },
        1,
    );
    let read = Bytes::from(vec![b'x'; 16 << 10]);
    let within = read.as_ptr_range();
    for (topic, len) in [("small", 50), ("larger", 1_000)] {
        let p = Publish {
            payload: read.slice(100..100 + len),
            ..text(topic, "")
        };
        e.publish(&p, 1).unwrap();
        let Some(Last::Unmade(kept)) = &e.topic_state(topic).last else {
            panic!("kept unencoded");
        };
        let small = matches!(kept.payload, topics::KeptPayload::Inline { .. });
        assert_eq!(small, len == 50, "{topic}: inline only when small");
        let bytes = kept.payload.to_bytes();
        assert_eq!(bytes, p.payload);
        if let topics::KeptPayload::Detached(own) = &kept.payload {
            assert!(
                !within.contains(&own.as_ptr()),
                "{topic}: a copy of its own"
            );
        }
    }
}

/// The `subscribed` reply's cursor.
fn cursor_of(reply: &Value) -> String {
    reply["cursor"].as_str().expect("a cursor").to_owned()
}

fn seqs_of(msgs: &[Value], topic: &str) -> Vec<u64> {
    msgs.iter()
        .filter(|m| m["op"] == "msg" && m["topic"] == topic)
        .map(|m| m["seq"].as_u64().unwrap())
        .collect()
}

/// A wildcard subscription that recovers names the topics it saw; a topic that first appeared
/// under the pattern while it was away (and a quiet one published again) is replayed from its
/// cursor, and the reply says recovered only when nothing is missing.
#[test]
fn a_wildcard_recovers_topics_it_never_saw() {
    let mut e = engine();
    publish(&mut e, "w/quiet", "q1");
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"w/>"}"#, 0).unwrap();
    let cursor = cursor_of(&inbox.take()[0]);
    publish(&mut e, "w/a", "a1");
    let epoch_a = inbox.take()[0]["epoch"].as_str().unwrap().to_owned();
    e.disconnect(a);
    // While it is away: a new topic, and the quiet one again.
    publish(&mut e, "w/b", "b1");
    publish(&mut e, "w/b", "b2");
    publish(&mut e, "w/quiet", "q2");
    publish(&mut e, "w/a", "a2");
    let (b, inbox) = client(&mut e);
    let since = format!(
        r#"{{"op":"sub","topic":"w/>","cursor":"{cursor}","since":{{"w/a":{{"seq":1,"epoch":"{epoch_a}"}}}}}}"#
    );
    req(&mut e, b, &since, 0).unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["recovered"], true, "{}", got[0]);
    assert_eq!(got[0]["replayed"], 4);
    assert_eq!(data(&got), ["a2", "b1", "b2", "q2"]);
    // The cursor of another run (or none) is the beginning: everything held is replayed.
    let (c, inbox) = client(&mut e);
    let since = format!(
        r#"{{"op":"sub","topic":"w/>","cursor":"0.5","since":{{"w/a":{{"seq":2,"epoch":"{epoch_a}"}}}}}}"#
    );
    req(&mut e, c, &since, 0).unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["recovered"], true);
    assert_eq!(data(&got), ["b1", "b2", "q1", "q2"]);
}

/// What came after the cursor and is no longer held is a gap, never a silence.
#[test]
fn a_wildcard_reports_what_its_cursor_cannot_cover() {
    let config = EngineConfig {
        history: vec![HistoryRule {
            pattern: ">".into(),
            max_messages: 4,
            ..HistoryRule::default()
        }],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"w/>"}"#, 0).unwrap();
    let cursor = cursor_of(&inbox.take()[0]);
    e.disconnect(a);
    for i in 1..=10 {
        publish(&mut e, "w/new", &i.to_string());
    }
    let (b, inbox) = client(&mut e);
    let request = format!(r#"{{"op":"sub","topic":"w/>","cursor":"{cursor}","since":{{}}}}"#);
    req(&mut e, b, &request, 0).unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["recovered"], false);
    assert_eq!(
        got[0]["gaps"],
        json!([{"topic":"w/new","reason":"history_trimmed","from":1,"to":6}])
    );
    assert_eq!(seqs_of(&got, "w/new"), [7, 8, 9, 10]);
}

/// With a snapshot too, a topic with nothing after the cursor gets its last value; one with
/// news gets the news, not a snapshot that would skip some of it.
#[test]
fn snapshot_and_cursor_together() {
    let mut e = engine();
    publish(&mut e, "s/old", "o1");
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"s/>"}"#, 0).unwrap();
    let cursor = cursor_of(&inbox.take()[0]);
    e.disconnect(a);
    publish(&mut e, "s/new", "n1");
    publish(&mut e, "s/new", "n2");
    let (b, inbox) = client(&mut e);
    let request = format!(r#"{{"op":"sub","topic":"s/>","snapshot":true,"cursor":"{cursor}"}}"#);
    req(&mut e, b, &request, 0).unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["recovered"], true);
    assert_eq!(data(&got), ["n1", "n2", "o1"]);
}

/// A recovery from a cursor replays exactly the topics published after it that its pattern
/// matches and `since` does not name, in name order: whether most of the topics were published
/// since or few of those the pattern matches, and with topics forgotten meanwhile, some of them
/// made again (replayed from their new start) and some not (not replayed).
#[test]
fn a_cursor_recovers_exactly_the_topics_published_after_it() {
    let config = EngineConfig {
        topic_idle_us: 10_000,
        history: vec![HistoryRule {
            pattern: ">".into(),
            max_messages: 1_000,
            ..HistoryRule::default()
        }],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    // 3,000 topics: `c/0`…`c/9`, then `a/…` and `b/…` in turn.
    let name = |i: u64| match i {
        ..10 => format!("c/{i}"),
        _ if i.is_multiple_of(2) => format!("a/{i}"),
        _ => format!("b/{i}"),
    };
    for i in 0..3_000 {
        e.publish(&text(&name(i), "before"), 0).unwrap();
    }
    // A subscriber to `a/>` keeps those topics from being forgotten.
    let (keeper, _kept) = client(&mut e);
    req(&mut e, keeper, r#"{"op":"sub","topic":"a/>"}"#, 0).unwrap();
    let (a, inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":">"}"#, 0).unwrap();
    let cursor = cursor_of(&inbox.take()[0]);
    e.disconnect(a);

    // What each topic published after the cursor holds now.
    let mut after = BTreeMap::new();
    let mut random = 7u64;
    let mut pick = |n: u64| {
        random = crate::mix::splitmix64(random);
        random % n
    };
    let mut k = 0;
    type After = BTreeMap<String, Vec<String>>;
    let mut publish_at = |e: &mut Engine<Inbox>, after: &mut After, topic: String, now| {
        k += 1;
        e.publish(&text(&topic, &format!("p{k}")), now).unwrap();
        after.entry(topic).or_default().push(format!("p{k}"));
    };
    // Topics published early on, then forgotten when the sweep finds them idle.
    for _ in 0..300 {
        let topic = name(pick(3_000) | 1);
        publish_at(&mut e, &mut after, topic, 1_000);
    }
    e.sweep(12_000, None, usize::MAX);
    after.retain(|topic, _| e.epoch_of(topic).is_some());
    assert!(e.topic_count() < 2_000, "the `b/…` and `c/…` went");
    // Most topics published again, forgotten ones among them: made again, in a new epoch.
    for _ in 0..5_000 {
        let topic = name(pick(3_000));
        publish_at(&mut e, &mut after, topic, 13_000);
    }
    assert!(
        after.len() > 2_000,
        "{} topics published since",
        after.len()
    );

    let since = ["a/20", "b/1001", "c/3"].map(|t| {
        let (epoch, seq) = (e.epoch_of(t).map(str::to_owned), e.topic_state(t).seq);
        (t, json!({"epoch": epoch, "seq": seq}))
    });
    for pattern in [">", "a/>", "c/>", "*/7", "b/1001", "b/1003"] {
        let (b, inbox) = client(&mut e);
        let since: serde_json::Map<String, Value> = since
            .iter()
            .filter(|(t, _)| topic::matches(pattern, t))
            .map(|(t, position)| (t.to_string(), position.clone()))
            .collect();
        let request = json!({"op": "sub", "topic": pattern, "cursor": cursor, "since": since});
        req(&mut e, b, &request.to_string(), 13_000).unwrap();
        let got = inbox.take();
        let expected: Vec<&str> = after
            .iter()
            .filter(|(t, _)| topic::matches(pattern, t) && !since.contains_key(*t))
            .flat_map(|(_, data)| data.iter().map(String::as_str))
            .collect();
        assert_eq!(got[0]["recovered"], true, "{pattern}: {}", got[0]);
        assert_eq!(got[0]["replayed"], expected.len(), "{pattern}");
        assert_eq!(data(&got), expected, "{pattern}");
        e.disconnect(b);
    }

    // From a later cursor, with a few topics published since (one made again among them).
    let (c, inbox) = client(&mut e);
    req(&mut e, c, r#"{"op":"sub","topic":">"}"#, 13_000).unwrap();
    let cursor = cursor_of(&inbox.take()[0]);
    let mut recent = BTreeMap::new();
    let forgotten = (1..3_000).map(name).find(|t| e.epoch_of(t).is_none());
    for topic in forgotten
        .into_iter()
        .chain((0..20).map(|_| name(pick(3_000))))
    {
        publish_at(&mut e, &mut recent, topic, 13_000);
    }
    inbox.take();
    let request = json!({"op": "sub", "topic": ">", "cursor": cursor});
    req(&mut e, c, &request.to_string(), 13_000).unwrap();
    let got = inbox.take();
    let expected: Vec<&str> = recent.values().flatten().map(String::as_str).collect();
    assert_eq!(got[0]["replayed"], expected.len());
    assert_eq!(data(&got[..=expected.len()]), expected);
}

/// `seq` at the largest number there is has nothing after it: no wrapped `seq + 1`, no bogus
/// gap.
#[test]
fn since_at_the_largest_seq_is_recovered_without_a_gap() {
    let mut e = engine();
    publish(&mut e, "t", "1");
    let epoch = e.epoch_of("t").unwrap().to_owned();
    let (a, inbox) = client(&mut e);
    let request = format!(
        r#"{{"op":"sub","topic":"t","since":{{"t":{{"seq":18446744073709551615,"epoch":"{epoch}"}}}}}}"#
    );
    req(&mut e, a, &request, 0).unwrap();
    let got = inbox.take();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0]["recovered"].clone(), got[0].get("gaps")),
        (json!(true), None)
    );
}

/// An outbox that may queue at most `room` bytes of recovery.
#[derive(Clone)]
struct Limited {
    inbox: Inbox,
    room: Rc<std::cell::Cell<usize>>,
}

impl Outbox for Limited {
    fn reply(&self, reply: &Reply) {
        self.inbox.reply(reply)
    }
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        self.inbox.dropped(topic, count, reason)
    }
    fn deliver(&self, message: &Message, delivery: &Delivery) {
        self.inbox.deliver(message, delivery)
    }
    fn recovered(&self, message: &Message) {
        self.inbox.recovered(message)
    }
    fn recovery_room(&self) -> usize {
        self.room.get()
    }
    fn snapshot(&self, pattern: &str, count: usize) {
        self.inbox.snapshot(pattern, count)
    }
}

/// A connection of `e` that may queue `room` bytes of recovery (to be changed through the
/// `Cell`), and what it is sent.
fn limited(e: &mut Engine<Limited>, room: usize) -> (ConnId, Inbox, Rc<std::cell::Cell<usize>>) {
    let inbox = Inbox::default();
    let room = Rc::new(std::cell::Cell::new(room));
    let limited = Limited {
        inbox: inbox.clone(),
        room: room.clone(),
    };
    (e.connect(limited), inbox, room)
}

/// The size of topic `name`'s last message.
fn last_size(e: &Engine<Limited>, name: &str) -> usize {
    let topic = e.topics_page(name, None, 1).next().unwrap();
    topic.last().unwrap().size()
}

/// A recovery larger than the connection may queue sends its newest messages and reports the
/// oldest as `recovery_limit` gaps, topic by topic.
#[test]
fn a_recovery_larger_than_its_room_sends_the_newest_and_says_what_it_left_out() {
    let mut e: Engine<Limited> = Engine::new(EngineConfig::default(), 1);
    let payload = "x".repeat(1000);
    for round in 0..3 {
        for cam in 0..4 {
            e.publish(
                &text(&format!("cam/{cam}"), &format!("{round}{payload}")),
                0,
            )
            .unwrap();
        }
    }
    let frame_len = last_size(&e, "cam/0");
    let (a, inbox, _) = limited(&mut e, frame_len * 6);
    // The snapshot (4 values) fits; a recovery of all 12 messages does not.
    e.handle(
        a,
        decode_text(r#"{"op":"sub","topic":"cam/>","snapshot":true}"#).unwrap(),
        0,
    )
    .unwrap();
    let got = inbox.take();
    assert_eq!((got[0]["recovered"].clone(), got.len()), (json!(true), 5));
    e.handle(
        a,
        decode_text(r#"{"op":"sub","topic":"cam/>","cursor":"x"}"#).unwrap(),
        0,
    )
    .unwrap();
    let got = inbox.take();
    assert_eq!(got[0]["recovered"], false);
    assert_eq!(got[0]["replayed"], 6);
    // Published round by round, so the oldest six are rounds 0 and 1 of cam/0..3 minus the
    // newest two of round 1.
    assert_eq!(
        got[0]["gaps"],
        json!([
            {"topic":"cam/0","reason":"recovery_limit","from":1,"to":2},
            {"topic":"cam/1","reason":"recovery_limit","from":1,"to":2},
            {"topic":"cam/2","reason":"recovery_limit","from":1,"to":1},
            {"topic":"cam/3","reason":"recovery_limit","from":1,"to":1}])
    );
    assert_eq!(seqs_of(&got, "cam/0"), [3]);
    assert_eq!(seqs_of(&got, "cam/2"), [2, 3]);
}

/// Finding a pattern's topics walks the ordered names level by level and finds exactly what
/// matching every topic would, in name order, including levels that sort between another level
/// and its subtree (`a/b-x` lies between `a/b` and `a/b/c`).
#[test]
fn a_patterns_topics_are_found_by_walking_the_names() {
    let names = [
        "a", "a/b", "a/b/c", "a/bb", "a/b/c/d", "ab/c", "b/a", "a/x/c", "a/b/>x", "z", "a/b-x",
        "a/b-x/c", "a/b.y/c", "a-/c", "a./c", "a/b!/c", "c/a", "c/b/a", "c/b-/a",
    ];
    let patterns = [
        "a/>",
        "a/*",
        "a/*/c",
        "*/a",
        ">",
        "a/b",
        "a/b/>",
        "*",
        "nothing/>",
        "*/c",
        "*/*/a",
        "*/b/>",
        "*/*",
        "*/*/*",
        "a/*/>",
        "c/*/a",
        "*/b-/a",
        "a/b-x/*",
    ];
    assert_walks_as_brute_force(&names, patterns.iter().copied());
    // Every pattern over a small universe of levels, a third of its topics missing.
    let levels = ["a", "b", "a-", "b0"];
    let mut universe = Vec::new();
    for x in levels {
        universe.push(x.to_string());
        for y in levels {
            universe.push(format!("{x}/{y}"));
            for z in levels {
                universe.push(format!("{x}/{y}/{z}"));
            }
        }
    }
    let held: Vec<&str> = universe
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 1)
        .map(|(_, n)| n.as_str())
        .collect();
    let parts = ["a", "b", "a-", "*"];
    let mut patterns = vec![">".to_string()];
    for x in parts {
        patterns.extend([x.to_string(), format!("{x}/>")]);
        for y in parts {
            patterns.extend([format!("{x}/{y}"), format!("{x}/{y}/>")]);
            patterns.extend(parts.iter().map(|z| format!("{x}/{y}/{z}")));
        }
    }
    assert_walks_as_brute_force(&held, patterns.iter().map(String::as_str));

    let mut e = engine();
    for n in names {
        publish(&mut e, n, "v");
    }
    let page: Vec<&str> = e
        .topics_page("a/", Some("a/b/c"), 2)
        .map(|t| t.name)
        .collect();
    assert_eq!(page, ["a/b/c/d", "a/bb"]);
    assert_eq!(e.topic_count_under("a/"), 10);
    assert_eq!(e.topic_count_under(""), names.len());
}

/// `Topics::matching` finds, for every pattern, what testing every topic of `names` finds, and
/// so does `Topics::walk` in slices.
fn assert_walks_as_brute_force<'p>(names: &[&str], patterns: impl Iterator<Item = &'p str>) {
    let mut e = engine();
    for n in names {
        publish(&mut e, n, "v");
    }
    for pattern in patterns {
        let found: Vec<&str> = e
            .topics
            .matching(pattern)
            .iter()
            .map(|t| &*t.name)
            .collect();
        let mut expected: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| topic::matches(pattern, n))
            .collect();
        expected.sort_unstable();
        assert_eq!(found, expected, "{pattern}");
        // Walked a few steps at a time, each walk going on where the last stopped, it finds
        // the same, once each, in the same order.
        for budget in [1, 2, 3, 5] {
            let mut sliced = Vec::new();
            let mut from = String::new();
            while let Some(next) = e.topics.walk(pattern, &from, budget, |t| {
                sliced.push(&*t.name);
                true
            }) {
                assert!(
                    next > from,
                    "{pattern}: a walk of {budget} steps makes progress"
                );
                from = next;
            }
            assert_eq!(sliced, expected, "{pattern} in walks of {budget} steps");
        }
    }
}

/// Past `max_topics`, a publish that would create a topic is refused; existing topics go on.
#[test]
fn publishing_past_max_topics_is_refused_for_new_topics_only() {
    let config = EngineConfig {
        max_topics: 3,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    for t in ["a", "b", "c"] {
        publish(&mut e, t, "x");
    }
    let err = e.publish(&text("d", "x"), 0).unwrap_err();
    assert_eq!(err.code, "too_many_topics");
    assert_eq!(e.publish(&text("a", "y"), 0).unwrap().seq, 2);
    assert_eq!(e.topic_count(), 3);
}

/// The sweep trims aged history without a publish, forgets idle topics nobody subscribes to
/// (a topic published again afterwards starts a new epoch, so a recovery across it is told),
/// keeps those with a subscriber, and goes through the topics a slice at a time.
#[test]
fn the_sweep_trims_history_and_forgets_idle_unsubscribed_topics() {
    let secs = 1_000_000;
    let config = EngineConfig {
        topic_idle_us: 100 * secs,
        history: vec![HistoryRule {
            pattern: ">".into(),
            max_age_secs: 10,
            ..HistoryRule::default()
        }],
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    for t in ["idle/1", "idle/2", "kept/1", "fresh/1"] {
        e.publish(&text(t, "x"), 0).unwrap();
    }
    e.publish(&text("fresh/1", "y"), 95 * secs).unwrap();
    let (a, _inbox) = client(&mut e);
    req(&mut e, a, r#"{"op":"sub","topic":"kept/>"}"#, 0).unwrap();
    let epoch = e.epoch_of("idle/1").unwrap().to_owned();

    // At 20 s nothing is idle, but history older than 10 s is gone.
    let swept = e.sweep(20 * secs, None, 100);
    assert_eq!(
        (swept.visited, swept.forgotten, swept.resume_after),
        (4, 0, None)
    );
    let view = e.topics_page("idle/1", None, 1).next().unwrap();
    assert_eq!(view.history, 0);
    assert!(view.last().is_some(), "the last value stays");

    // At 150 s, in slices of two: the idle topics without a subscriber go.
    let first = e.sweep(150 * secs, None, 2);
    assert_eq!(first.resume_after.as_deref(), Some("idle/1"));
    let second = e.sweep(150 * secs, first.resume_after.as_deref(), 2);
    assert_eq!(first.forgotten + second.forgotten, 2);
    let third = e.sweep(150 * secs, second.resume_after.as_deref(), 2);
    assert_eq!(third.resume_after, None);
    let left: Vec<&str> = e.topics_page("", None, 10).map(|t| t.name).collect();
    assert_eq!(left, ["fresh/1", "kept/1"]);

    // Published again, a forgotten topic has a new epoch.
    e.publish(&text("idle/1", "again"), 151 * secs).unwrap();
    assert_ne!(e.epoch_of("idle/1").unwrap(), epoch);
}

/// Each origin (a token's subject) may create at most `max_topics_per_origin` topics, and no
/// more once what its topics keep passes `max_retained_bytes_per_origin`; forgotten topics
/// give their share back; origin 0 and others' topics are not charged.
#[test]
fn an_origin_is_charged_for_the_topics_it_creates() {
    let config = EngineConfig {
        max_topics_per_origin: 2,
        max_retained_bytes_per_origin: 3000,
        topic_idle_us: 10,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config, 1);
    let (alice, inbox) = client(&mut e);
    e.set_origin(alice, 1);
    let big = "x".repeat(1000);
    req(
        &mut e,
        alice,
        &format!(r#"{{"op":"pub","topic":"a/1","data":"{big}"}}"#),
        0,
    )
    .unwrap();
    req(&mut e, alice, r#"{"op":"pub","topic":"a/2","data":"y"}"#, 0).unwrap();
    let usage = e.usage(1);
    assert_eq!(usage.topics, 2);
    assert!(usage.retained > 1000 && usage.retained < 1200, "{usage:?}");
    // A third topic is refused; publishing to its own topics goes on.
    assert_eq!(
        req(
            &mut e,
            alice,
            r#"{"op":"pub","id":1,"topic":"a/3","data":"z"}"#,
            0
        ),
        Err("too_many_topics")
    );
    assert_eq!(inbox.take()[0]["id"], 1);
    req(
        &mut e,
        alice,
        r#"{"op":"pub","topic":"a/2","data":"again"}"#,
        0,
    )
    .unwrap();
    // Someone else's topics, and publishes nobody is charged for, cost alice nothing.
    publish(&mut e, "b/1", "other");
    req(
        &mut e,
        alice,
        r#"{"op":"pub","topic":"b/1","data":"mine too"}"#,
        0,
    )
    .unwrap();
    assert_eq!(e.usage(1).topics, 2);
    // Over its bytes, alice may create no topic even with room in the count.
    e.sweep(1_000, None, 100);
    assert_eq!(
        e.usage(1),
        Usage::default(),
        "forgotten topics are given back"
    );
    let huge = "x".repeat(3000);
    req(
        &mut e,
        alice,
        &format!(r#"{{"op":"pub","topic":"a/4","data":"{huge}"}}"#),
        2_000,
    )
    .unwrap();
    assert_eq!(
        req(
            &mut e,
            alice,
            r#"{"op":"pub","topic":"a/5","data":"z"}"#,
            2_000
        ),
        Err("retained_limit")
    );
    assert_eq!(e.usage(1).topics, 1);
}

/// Encodes messages in its own slot (as herald does), counting the times it really encodes.
#[derive(Default)]
struct Counting {
    encoded: std::cell::Cell<usize>,
}

impl Encode for Counting {
    fn message(&self, m: &Message, out: &mut Vec<Frame>) {
        out.push(
            m.encoded(1, |m| {
                self.encoded.set(self.encoded.get() + 1);
                Native.frame(m)
            })
            .clone(),
        );
    }
    fn reply(&self, reply: &Reply) -> Frame {
        Native.reply(reply)
    }
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) -> Frame {
        Native.dropped(topic, count, reason)
    }
}

/// A connection whose messages go through a queue drained with a shared [`Counting`] codec,
/// as a server connection's writer drains it.
#[derive(Clone)]
struct Queued {
    queue: Rc<RefCell<crate::outbox::OutboundQueue>>,
    codec: Rc<Counting>,
}

impl Queued {
    fn drain(&self) -> Vec<Frame> {
        let mut out = Vec::new();
        self.queue
            .borrow_mut()
            .drain_into(&mut out, &*self.codec, 0);
        out
    }
}

/// A [`Queued`] connection drained with `codec`, subscribed with `sub`.
fn queued(e: &mut Engine<Queued>, codec: &Rc<Counting>, sub: &str) -> Queued {
    let q = Queued {
        queue: Rc::new(RefCell::new(crate::outbox::OutboundQueue::new(1 << 20))),
        codec: codec.clone(),
    };
    let id = e.connect(q.clone());
    e.handle(id, decode_text(sub).unwrap(), 0).unwrap();
    q
}

impl Outbox for Queued {
    fn reply(&self, reply: &Reply) {
        self.queue.borrow_mut().push(self.codec.reply(reply));
    }
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        let notice = self.codec.dropped(topic, count, reason);
        self.queue.borrow_mut().push(notice);
    }
    fn deliver(&self, message: &Message, delivery: &Delivery) {
        self.queue.borrow_mut().deliver(message, delivery);
    }
    fn recovered(&self, message: &Message) {
        self.queue.borrow_mut().push_recovered(message.clone());
    }
    fn snapshot(&self, pattern: &str, count: usize) {
        if let Some(notice) = self.codec.snapshot(pattern, count) {
            self.queue.borrow_mut().push(notice);
        }
    }
}

/// A message delivered live to many connections, then replayed from history and sent as a
/// snapshot to others, is encoded once for the protocol they speak, and every one of them is
/// sent the same bytes; a message that never leaves a queue is never encoded.
#[test]
fn a_message_is_encoded_once_however_it_reaches_its_subscribers() {
    let codec = Rc::new(Counting::default());
    let mut e: Engine<Queued> = Engine::new(EngineConfig::default(), 1);
    let live: Vec<_> = (0..20)
        .map(|_| queued(&mut e, &codec, r#"{"op":"sub","topic":"t/>"}"#))
        .collect();
    live.iter()
        .for_each(|q| assert_eq!(q.drain().len(), 1, "the reply"));
    let cursor = e.cursor();
    e.publish(&text("t/a", "hello"), 0).unwrap();
    e.publish(&text("t/unsent", "never drained"), 0).unwrap();
    let replayed = queued(
        &mut e,
        &codec,
        &format!(r#"{{"op":"sub","topic":"t/a","cursor":"{cursor}"}}"#),
    );
    let snapshot = queued(
        &mut e,
        &codec,
        r#"{"op":"sub","topic":"t/a","snapshot":true}"#,
    );
    // The first ten drain both messages, `t/a` first; the recovering two their reply and `t/a`.
    let mut heads = Vec::new();
    for q in &live[..10] {
        heads.push(q.drain()[0].head.as_ptr());
    }
    for q in [&replayed, &snapshot] {
        let frames = q.drain();
        assert_eq!(frames.len(), 2);
        heads.push(frames[1].head.as_ptr());
    }
    // What the other ten hold of `t/unsent` and `t/a` was never drained.
    assert_eq!(codec.encoded.get(), 2, "each drained message encoded once");
    let mut first = Vec::new();
    live[0].codec.message(
        &e.topics_page("t/a", None, 1)
            .next()
            .unwrap()
            .last()
            .unwrap(),
        &mut first,
    );
    let first = &first[0];
    assert_eq!(codec.encoded.get(), 2);
    assert!(heads.iter().all(|h| *h == first.head.as_ptr()));
}

/// A message the history keeps lets its encodings go once a newer one follows it and no queue
/// holds it any more, and a recovery then encodes it anew; one that a queue still holds when
/// the next comes keeps them, so that its subscriber is sent the bytes the others were.
#[test]
fn a_kept_message_lets_its_encodings_go_once_every_queue_has_sent_it() {
    let codec = Rc::new(Counting::default());
    let mut e: Engine<Queued> = Engine::new(EngineConfig::default(), 1);
    let prompt = queued(&mut e, &codec, r#"{"op":"sub","topic":"t/>"}"#);
    let late = queued(&mut e, &codec, r#"{"op":"sub","topic":"t/>"}"#);
    assert_eq!(prompt.drain().len() + late.drain().len(), 2, "the replies");
    let cursor = e.cursor();
    e.publish(&text("t/a", "one"), 0).unwrap();
    let one = prompt.drain();
    // `late` still holds "one" when "two" comes: it keeps its bytes.
    e.publish(&text("t/a", "two"), 0).unwrap();
    let late_got = late.drain();
    assert_eq!(late_got[0].head.as_ptr(), one[0].head.as_ptr());
    let two = prompt.drain();
    assert_eq!(codec.encoded.get(), 2);
    // Nothing holds "two" when "three" comes: its bytes go.
    e.publish(&text("t/a", "three"), 0).unwrap();
    prompt.drain();
    late.drain();
    assert_eq!(codec.encoded.get(), 3);
    let recovering = queued(
        &mut e,
        &codec,
        &format!(r#"{{"op":"sub","topic":"t/a","cursor":"{cursor}"}}"#),
    );
    let got = recovering.drain();
    let data: Vec<_> = got[1..]
        .iter()
        .map(|f| frame_json(f)["data"].clone())
        .collect();
    assert_eq!(data, ["one", "two", "three"]);
    assert_eq!(codec.encoded.get(), 4, "\"two\" encoded again, alone");
    assert_eq!(got[1].head.as_ptr(), one[0].head.as_ptr());
    assert_ne!(got[2].head.as_ptr(), two[0].head.as_ptr());
    assert_eq!(got[2].head, two[0].head, "the same bytes");
    assert_eq!(e.topic_state("t/a").last_message().unwrap().seq(), 3);
}

/// What a client makes of one connection's frames, as the SDKs do: a `subscribed` reply's
/// `replayed` and a `snapshot` notice's `count` say how many of the message frames that follow
/// are recovered. Returns the messages as `(topic, seq, recovered)`, and checks that no other
/// frame comes between a count and the messages it counts.
fn classify(frames: &[Value]) -> Vec<(String, u64, bool)> {
    let mut to_come = 0;
    let mut out = Vec::new();
    for f in frames {
        match f["op"].as_str().unwrap() {
            "subscribed" | "snapshot" => {
                assert_eq!(to_come, 0, "counted messages come at once: {f}");
                to_come = f["replayed"].as_u64().or(f["count"].as_u64()).unwrap();
            }
            "msg" => {
                let recovered = to_come > 0;
                to_come -= u64::from(recovered);
                let topic = f["topic"].as_str().unwrap().to_owned();
                out.push((topic, f["seq"].as_u64().unwrap(), recovered));
            }
            op => panic!("unexpected {op}"),
        }
    }
    assert_eq!(to_come, 0, "every counted message came");
    out
}

/// A snapshot of more topics than one slice goes in slices, none of more than `snapshot::SLICE`
/// values, each announced with its count; live messages interleave, and per topic the client
/// gets its last value then what follows, or, for a topic published before the walk reached
/// it, what follows alone: never a live message before the topic's value, never a message
/// twice, no topic missing, and what is recovered is told apart from what is live.
#[test]
fn a_snapshot_larger_than_a_slice_goes_in_slices_and_each_topic_keeps_its_order() {
    let mut e = engine();
    let n = 3 * snapshot::SLICE + 10;
    let name = |i: usize| format!("s/{i:05}");
    for i in 0..n {
        publish(&mut e, &name(i), "old");
    }
    let (a, inbox) = client(&mut e);
    req(
        &mut e,
        a,
        r#"{"op":"sub","topic":"s/>","snapshot":true}"#,
        0,
    )
    .unwrap();
    let mut frames = inbox.take();
    assert_eq!(frames[0]["replayed"], snapshot::SLICE);
    assert!(e.snapshots_pending());
    // Published while the snapshot is under way: a topic already walked, one not walked yet
    // (twice), and a new one.
    let (walked, ahead) = (name(100), name(n - 2));
    for t in [&walked, &ahead, &ahead, &"s/new".to_string()] {
        publish(&mut e, t, "live");
    }
    let mut slices = 0;
    loop {
        let served = e.serve_snapshots(0);
        let got = inbox.take();
        let counts = got.iter().filter(|f| f["op"] == "snapshot");
        assert!(counts
            .map(|f| &f["count"])
            .all(|c| c.as_u64() <= Some(snapshot::SLICE as u64)));
        frames.extend(got);
        match served {
            Served::More => slices += 1,
            other => {
                assert_eq!(other, Served::Idle);
                break;
            }
        }
        publish(&mut e, &name(slices), "between");
    }
    assert_eq!(slices, 3);
    assert!(!e.snapshots_pending());
    let got = classify(&frames);
    let mut seen = std::collections::HashSet::new();
    for (topic, seq, recovered) in &got {
        assert!(seen.insert((topic, seq)), "{topic} {seq} came twice");
        // A recovered message is the value from before the request, seq 1; live ones follow.
        assert_eq!(*recovered, *seq == 1 && topic != "s/new", "{topic} {seq}");
    }
    let of = |t: &str| -> Vec<(u64, bool)> {
        got.iter()
            .filter(|(topic, ..)| topic == t)
            .map(|&(_, seq, r)| (seq, r))
            .collect()
    };
    assert_eq!(of(&walked), [(1, true), (2, false)]);
    assert_eq!(of(&ahead), [(2, false), (3, false)]);
    assert_eq!(of("s/new"), [(1, false)]);
    let topics: std::collections::HashSet<&str> = got.iter().map(|(t, ..)| t.as_str()).collect();
    assert_eq!(topics.len(), n + 1, "every topic, old and new");
}

/// A snapshot waits while the connection has no recovery room and goes on once it has: it is
/// paced by the client's reading, never cut, and the reply reports no gap.
#[test]
fn a_snapshot_waits_for_recovery_room_rather_than_leaving_values_out() {
    let mut e: Engine<Limited> = Engine::new(EngineConfig::default(), 1);
    for i in 0..10 {
        e.publish(&text(&format!("r/{i}"), "v"), 0).unwrap();
    }
    let size = last_size(&e, "r/0");
    let (a, inbox, room) = limited(&mut e, 3 * size);
    let sub = decode_text(r#"{"op":"sub","topic":"r/>","snapshot":true}"#).unwrap();
    e.handle(a, sub, 0).unwrap();
    let got = inbox.take();
    assert_eq!(
        (got[0]["recovered"].clone(), got[0]["replayed"].clone()),
        (json!(true), json!(3))
    );
    room.set(0);
    assert_eq!(e.serve_snapshots(0), Served::Waiting);
    assert!(inbox.take().is_empty());
    room.set(usize::MAX);
    assert_eq!(e.serve_snapshots(0), Served::More);
    let got = inbox.take();
    assert_eq!(got[0], json!({"op":"snapshot","topic":"r/>","count":7}));
    assert_eq!(got.len(), 8);
    assert_eq!(e.serve_snapshots(0), Served::Idle);
}

/// Unsubscribing, or leaving, ends a snapshot under way: nothing more of it is sent (a
/// connection that takes the id later gets nothing of it either).
#[test]
fn unsubscribing_or_leaving_ends_a_snapshot_under_way() {
    let mut e = engine();
    for i in 0..2 * snapshot::SLICE {
        publish(&mut e, &format!("u/{i:05}"), "v");
    }
    let sub = r#"{"op":"sub","topic":"u/>","snapshot":true}"#;
    let (a, inbox) = client(&mut e);
    req(&mut e, a, sub, 0).unwrap();
    req(&mut e, a, r#"{"op":"unsub","topic":"u/>"}"#, 0).unwrap();
    assert!(!e.snapshots_pending());
    req(&mut e, a, sub, 0).unwrap();
    assert!(e.snapshots_pending());
    e.disconnect(a);
    assert!(!e.snapshots_pending());
    assert_eq!(e.serve_snapshots(0), Served::Idle);
    inbox.take();
    let (b, inbox) = client(&mut e);
    assert_eq!(b, a);
    assert_eq!(e.serve_snapshots(0), Served::Idle);
    assert!(inbox.take().is_empty());
}

/// However many snapshots wait for their clients, one call looks at `snapshot::LOOK` of them at
/// most, and says that all wait only once it has looked at each.
#[test]
fn serving_snapshots_looks_at_a_bounded_number_per_call() {
    let mut e: Engine<Limited> = Engine::new(EngineConfig::default(), 1);
    let waiting = snapshot::LOOK + snapshot::LOOK / 2;
    for i in 0..waiting {
        e.publish(&text(&format!("w/{i}/t"), "v"), 0).unwrap();
    }
    let (a, inbox, room) = limited(&mut e, 0);
    for i in 0..waiting {
        let sub = format!(r#"{{"op":"sub","topic":"w/{i}/>","snapshot":true}}"#);
        e.handle(a, decode_text(&sub).unwrap(), 0).unwrap();
    }
    inbox.take();
    assert_eq!(e.serve_snapshots(0), Served::More);
    assert_eq!(e.serve_snapshots(0), Served::Waiting);
    room.set(usize::MAX);
    let mut served = 0;
    while e.serve_snapshots(0) == Served::More {
        served += 1;
    }
    assert_eq!(served, waiting);
    assert_eq!(data(&inbox.take()).len(), waiting);
}

/// A topic keeps the connections its publish found (`TopicState::find_matches`): after every
/// subscribe, unsubscribe and disconnect the next publish must reach exactly the connections
/// whose patterns match then. Checked against a model over random steps, with fan-outs on both
/// sides of what a topic keeps (up to 24 connections on one topic).
#[test]
fn a_publish_reaches_whoever_matches_after_every_subscription_change() {
    const PATTERNS: [&str; 5] = ["t/x", "t/*", "t/>", ">", "u/x"];
    const TOPICS: [&str; 2] = ["t/x", "u/x"];
    let mut e = engine();
    let mut clients: Vec<(ConnId, Inbox, BTreeSet<&str>)> = (0..24)
        .map(|_| {
            let (id, inbox) = client(&mut e);
            (id, inbox, BTreeSet::new())
        })
        .collect();
    let mut random = 7u64;
    let mut next = |n: usize| {
        random = crate::mix::splitmix64(random);
        (random % n as u64) as usize
    };
    let mut published = 0;
    let mut fan_outs = BTreeSet::new();
    for step in 0..3_000 {
        let who = next(clients.len());
        match next(10) {
            0..=2 => {
                let pattern = PATTERNS[next(PATTERNS.len())];
                let (id, _, subs) = &mut clients[who];
                req(
                    &mut e,
                    *id,
                    &json!({"op":"sub","topic":pattern}).to_string(),
                    0,
                )
                .unwrap();
                subs.insert(pattern);
            }
            3 | 4 => {
                let (id, _, subs) = &mut clients[who];
                let Some(&pattern) = subs.iter().nth(next(subs.len().max(1))) else {
                    continue;
                };
                req(
                    &mut e,
                    *id,
                    &json!({"op":"unsub","topic":pattern}).to_string(),
                    0,
                )
                .unwrap();
                subs.remove(pattern);
            }
            5 => {
                let (id, ..) = clients[who];
                e.disconnect(id);
                let (id, inbox) = client(&mut e);
                clients[who] = (id, inbox, BTreeSet::new());
            }
            _ => {
                let topic = TOPICS[next(TOPICS.len())];
                published += 1;
                let body = published.to_string();
                let reached = publish(&mut e, topic, &body).deliveries;
                let mut expected = 0;
                for (id, inbox, subs) in &clients {
                    let wants = subs.iter().any(|p| topic::matches(p, topic));
                    let got = data(&inbox.take()) == [body.as_str()];
                    assert_eq!(
                        got, wants,
                        "step {step}: connection {id} on {topic}, {subs:?}"
                    );
                    expected += usize::from(wants);
                }
                assert_eq!(reached, expected, "step {step}: deliveries on {topic}");
                fan_outs.insert(expected);
            }
        }
    }
    assert!(
        fan_outs.range(1..=16).count() > 5 && fan_outs.range(17..).count() > 2,
        "{fan_outs:?}"
    );
}
