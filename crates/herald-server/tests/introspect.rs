//! `GET /api/stats`, `GET /api/topics` and the dashboard's assets, over real sockets.

mod common;

use common::*;
use herald_server::Config;
use serde_json::{json, Value};

async fn get_json(server: &TestServer, path: &str) -> Value {
    let (status, body) = http(server.addr, "GET", path, &[], &[]).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path} is not JSON ({e}): {body}"))
}

#[tokio::test]
async fn stats_count_connections_messages_and_errors() {
    let server = TestServer::start(Config::default()).await;
    let mut a = server.connect().await;
    subscribe(&mut a, "s/>").await;
    let text = [("Content-Type", "text/plain")];
    http(server.addr, "POST", "/api/publish/s/1", &text, b"hello").await;
    http(server.addr, "POST", "/api/publish/a//b", &text, b"x").await;
    recv_json(&mut a).await;
    let s = get_json(&server, "/api/stats").await;
    assert_eq!(s["connections"], 1);
    assert_eq!(s["subscriptions"], 1);
    assert_eq!(s["topics"], 1);
    assert_eq!(s["messages_in"], 1);
    assert_eq!(s["bytes_in"], 5);
    assert_eq!(s["deliveries"], 1);
    assert_eq!(s["errors"], json!({"invalid_topic": 1}));
    assert_eq!(s["dropped"], json!({}));
    assert!(s["cluster"].is_null(), "a node alone: {s}");
    assert!(s["now_us"].as_u64().unwrap() > 1_700_000_000_000_000);
    server.stop().await;
}

#[tokio::test]
async fn topics_list_subscribers_and_last_values() {
    let server = TestServer::start(Config::default()).await;
    let mut a = server.connect().await;
    subscribe(&mut a, "t/*").await;
    let mut b = server.connect().await;
    subscribe(&mut b, "t/>").await;
    subscribe(&mut b, "t/text").await; // overlapping: still one subscriber
    let long = "é".repeat(300);
    for (topic, ct, body) in [
        ("t/text", "text/plain", "first".as_bytes()),
        ("t/text", "text/plain", long.as_bytes()),
        ("t/bin", "image/fits", &[0u8, 1, 2, 3][..]),
        ("u", "text/plain", b"alone"),
    ] {
        let (status, _) = http(
            server.addr,
            "POST",
            &format!("/api/publish/{topic}"),
            &[("Content-Type", ct)],
            body,
        )
        .await;
        assert_eq!(status, 200);
    }
    let all = get_json(&server, "/api/topics").await;
    assert_eq!(all["total"], 3);
    assert_eq!(all["truncated"], false);
    let names: Vec<&str> = all["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["topic"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t/bin", "t/text", "u"], "sorted by name");
    let text = &all["topics"][1];
    assert_eq!(text["seq"], 2);
    assert_eq!(text["subscribers"], 2);
    assert_eq!(text["last"]["ct"], "text/plain");
    assert_eq!(text["last"]["bytes"], long.len());
    assert_eq!(text["last"]["truncated"], true);
    assert_eq!(text["last"]["text"], "é".repeat(200), "cut by characters");
    let bin = &all["topics"][0];
    assert_eq!(
        bin["last"],
        json!({"ct": "image/fits", "bytes": 4, "binary": true})
    );
    assert_eq!(all["topics"][2]["subscribers"], 0);

    let some = get_json(&server, "/api/topics?prefix=t/&limit=1").await;
    assert_eq!(some["total"], 2);
    assert_eq!(some["truncated"], true);
    assert_eq!(some["topics"].as_array().unwrap().len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn dashboard_and_its_assets_are_served() {
    let server = TestServer::start(Config::default()).await;
    let (status, page) = http(server.addr, "GET", "/", &[], &[]).await;
    assert_eq!(status, 200);
    assert!(page.contains("/dashboard/app.js"));
    for asset in [
        "app.js",
        "fits.js",
        "herald-client.js",
        "topic.js",
        "style.css",
    ] {
        let (status, body) =
            http(server.addr, "GET", &format!("/dashboard/{asset}"), &[], &[]).await;
        assert_eq!(status, 200, "{asset}");
        assert!(!body.is_empty());
    }
    let (status, _) = http(server.addr, "GET", "/dashboard/nope.js", &[], &[]).await;
    assert_eq!(status, 404);
    server.stop().await;
}
