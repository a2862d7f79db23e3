//! Authentication and permissions over real sockets: every way a token is presented, every way
//! a bad one is refused, and escalation attempts against a granted pattern.

mod common;

use common::*;
use herald_server::auth::AuthConfig;
use herald_server::Config;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SECRET: &str = "test-secret-that-is-at-least-32-bytes-long";
const ADMIN_KEY: &str = "admin-key-for-tests";

fn keys() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/keys")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A scratch directory holding the secret and admin key files.
struct Secrets(PathBuf);

impl Secrets {
    fn new(name: &str) -> Secrets {
        let dir = std::env::temp_dir().join(format!("herald-auth-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
        std::fs::write(dir.join("admin"), ADMIN_KEY).unwrap();
        Secrets(dir)
    }

    fn config(&self) -> Config {
        Config {
            auth: AuthConfig {
                hs256_secret_file: Some(self.0.join("secret")),
                admin_api_key_file: Some(self.0.join("admin")),
                audience: Some("herald-test".into()),
                leeway_secs: 0,
                ..AuthConfig::default()
            },
            ..Config::default()
        }
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn claims(sub: &[&str], publish: &[&str], ttl: i64) -> Value {
    json!({
        "sub": "alice",
        "aud": "herald-test",
        "exp": now() as i64 + ttl,
        "herald": {"sub": sub, "pub": publish},
    })
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value, kid: Option<&str>) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs256(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        claims,
        None,
    )
}

/// The usual grant: read FX quotes, publish orders for desk 1.
fn fx_token() -> String {
    hs256(&claims(&["quotes/fx/>"], &["orders/desk1/>"], 60))
}

async fn connect_with(server: &TestServer, query: &str, bearer: Option<&str>) -> Client {
    let mut request = format!("{}{query}", server.url())
        .into_client_request()
        .unwrap();
    if let Some(token) = bearer {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let (client, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    client
}

/// One metric series, fetched with the admin key (0 when absent).
async fn admin_metric(server: &TestServer, series: &str) -> f64 {
    common::metric(server.addr, ADMIN_KEY, series).await
}

/// Sends a request with id 1 and returns the reply.
async fn ask(client: &mut Client, mut request: Value) -> Value {
    request["id"] = 1.into();
    send(client, request).await;
    recv_json(client).await
}

/// Expects an error with `code`, then (for `unauthorized`) a 4003 close.
async fn expect_refusal(client: &mut Client, code: &str, close: Option<u16>) -> Value {
    let reply = recv_json(client).await;
    assert_eq!(reply["op"], "error", "{reply}");
    assert_eq!(reply["code"], code, "{reply}");
    if let Some(expected) = close {
        let frame = close_frame(client).await.expect("a close frame");
        assert_eq!(u16::from(frame.code), expected);
    }
    reply
}

#[tokio::test]
async fn all_three_ways_of_presenting_a_token_work() {
    let secrets = Secrets::new("ways");
    let server = TestServer::start(secrets.config()).await;
    let token = fx_token();

    let mut by_header = connect_with(&server, "", Some(&token)).await;
    subscribe(&mut by_header, "quotes/fx/>").await;

    let mut by_query = connect_with(&server, &format!("?token={token}"), None).await;
    subscribe(&mut by_query, "quotes/fx/EURUSD").await;

    let mut by_message = server.connect().await;
    let reply = ask(&mut by_message, json!({"op": "auth", "token": token})).await;
    assert_eq!(reply["op"], "authed", "{reply}");
    assert_eq!(reply["id"], 1);
    assert!(reply["exp"].as_u64().unwrap() > now());
    subscribe(&mut by_message, "quotes/fx/*").await;

    // A publisher granted the quotes reaches all three.
    let publisher = hs256(&claims(&[], &["quotes/fx/>"], 60));
    let mut publisher = connect_with(&server, "", Some(&publisher)).await;
    let ack = ask(
        &mut publisher,
        json!({"op": "pub", "topic": "quotes/fx/EURUSD", "data": "1.08"}),
    )
    .await;
    assert_eq!(ack["op"], "ack", "{ack}");
    for client in [&mut by_header, &mut by_query, &mut by_message] {
        let msg = recv_json(client).await;
        assert_eq!(msg["data"], "1.08", "{msg}");
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_tokens_are_refused_with_unauthorized_and_4003() {
    let secrets = Secrets::new("bad");
    let server = TestServer::start(secrets.config()).await;
    let good = claims(&["quotes/fx/>"], &[], 60);
    let wrong_secret = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"another-secret-another-secret-another"),
        &good,
        None,
    );
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = "someone-else".into();
    let mut no_aud = good.clone();
    no_aud.as_object_mut().unwrap().remove("aud");
    let mut no_exp = good.clone();
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut future = good.clone();
    future["nbf"] = (now() + 3600).into();
    let b64 = |v: &Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&good)
    );
    // Same signature, payload widened to `>`.
    let real = hs256(&good);
    let parts: Vec<&str> = real.split('.').collect();
    let mut widened = good.clone();
    widened["herald"]["sub"] = json!([">"]);
    let tampered = format!("{}.{}.{}", parts[0], b64(&widened), parts[2]);
    let cases = [
        ("expired", hs256(&claims(&["quotes/fx/>"], &[], -5))),
        ("wrong secret", wrong_secret),
        ("wrong audience", hs256(&wrong_aud)),
        ("no audience", hs256(&no_aud)),
        ("no exp", hs256(&no_exp)),
        ("not yet valid", hs256(&future)),
        ("alg none", alg_none),
        ("tampered", tampered),
        ("garbage", "not.a.jwt".to_owned()),
        ("bad grant", hs256(&claims(&["a/>/b"], &[], 60))),
    ];
    for (name, token) in &cases {
        for way in ["query", "message"] {
            let mut client = match way {
                "query" => connect_with(&server, &format!("?token={token}"), None).await,
                _ => {
                    let mut c = server.connect().await;
                    send(&mut c, json!({"op": "auth", "id": 1, "token": token})).await;
                    c
                }
            };
            let reply = expect_refusal(&mut client, "unauthorized", Some(4003)).await;
            eprintln!("{name} ({way}): {}", reply["message"]);
        }
    }
    // No token at all: the first request is refused and the connection closed.
    let mut anonymous = server.connect().await;
    send(
        &mut anonymous,
        json!({"op": "sub", "id": 1, "topic": "quotes/fx/>"}),
    )
    .await;
    let reply = expect_refusal(&mut anonymous, "unauthorized", Some(4003)).await;
    assert_eq!(reply["id"], 1);
    assert!(
        admin_metric(&server, "herald_disconnects_total{reason=\"unauthorized\"}").await >= 21.0
    );
    server.stop().await;
}

#[tokio::test]
async fn grants_refuse_escalation_without_closing() {
    let secrets = Secrets::new("escalate");
    let server = TestServer::start(secrets.config()).await;
    let mut client = connect_with(&server, "", Some(&fx_token())).await;
    for pattern in [
        "quotes/>",
        "orders/>",
        ">",
        "*/>",
        "*/fx/>",
        "quotes/*/EURUSD",
        "quotes/fx",
        "*",
    ] {
        let reply = ask(&mut client, json!({"op": "sub", "topic": pattern})).await;
        assert_eq!(reply["code"], "forbidden", "{pattern}: {reply}");
        assert_eq!(reply["id"], 1);
    }
    for topic in ["quotes/fx/EURUSD", "orders/desk2/1", "orders/desk1"] {
        let reply = ask(
            &mut client,
            json!({"op": "pub", "topic": topic, "data": "x"}),
        )
        .await;
        assert_eq!(reply["code"], "forbidden", "{topic}: {reply}");
    }
    // Still connected, and what is granted works.
    subscribe(&mut client, "quotes/fx/*/>").await;
    let ack = ask(
        &mut client,
        json!({"op": "pub", "topic": "orders/desk1/42", "data": "buy"}),
    )
    .await;
    assert_eq!(ack["op"], "ack", "{ack}");
    assert!(admin_metric(&server, "herald_request_errors_total{code=\"forbidden\"}").await >= 11.0);
    server.stop().await;
}

#[tokio::test]
async fn an_expiring_token_closes_4001_unless_refreshed() {
    let secrets = Secrets::new("expiry");
    let server = TestServer::start(secrets.config()).await;
    let short = hs256(&claims(&["quotes/fx/>"], &[], 2));

    let mut lapsing = connect_with(&server, "", Some(&short)).await;
    let mut refreshing = connect_with(&server, "", Some(&short)).await;
    subscribe(&mut refreshing, "quotes/fx/>").await;
    // Another subject may not take over the connection.
    let mut mallory = claims(&[">"], &[">"], 60);
    mallory["sub"] = "mallory".into();
    let reply = ask(
        &mut refreshing,
        json!({"op": "auth", "token": hs256(&mallory)}),
    )
    .await;
    assert_eq!(reply["code"], "unauthorized", "{reply}");
    let reply = ask(&mut refreshing, json!({"op": "auth", "token": fx_token()})).await;
    assert_eq!(reply["op"], "authed", "{reply}");

    let started = tokio::time::Instant::now();
    let frame = close_frame(&mut lapsing).await.expect("a close frame");
    assert_eq!(u16::from(frame.code), 4001);
    assert_eq!(frame.reason.as_str(), "token expired");
    assert!(started.elapsed() < Duration::from_secs(4));
    // The refreshed one outlives the first token.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pong = ask(&mut refreshing, json!({"op": "ping"})).await;
    assert_eq!(pong["op"], "pong", "{pong}");
    assert_eq!(
        admin_metric(
            &server,
            "herald_disconnects_total{reason=\"token_expired\"}"
        )
        .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn rs256_es256_and_jwks_keys_verify_and_keys_cannot_be_confused() {
    let read = |name: &str| std::fs::read(keys().join(name)).unwrap();
    let config = Config {
        auth: AuthConfig {
            rs256_public_key_file: Some(keys().join("rsa_public.pem")),
            es256_public_key_file: Some(keys().join("ec_public.pem")),
            ..AuthConfig::default()
        },
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut grant = claims(&["a/>"], &[], 60);
    grant.as_object_mut().unwrap().remove("aud");
    let rsa = EncodingKey::from_rsa_pem(&read("rsa_private.pem")).unwrap();
    let ec = EncodingKey::from_ec_pem(&read("ec_private.pem")).unwrap();
    for token in [
        sign(Algorithm::RS256, &rsa, &grant, None),
        sign(Algorithm::ES256, &ec, &grant, None),
    ] {
        let mut client = connect_with(&server, "", Some(&token)).await;
        subscribe(&mut client, "a/b").await;
    }
    // HS256 "signed" with the public key's bytes: the classic algorithm-confusion attack.
    let confused = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&read("rsa_public.pem")),
        &grant,
        None,
    );
    let mut client = connect_with(&server, "", Some(&confused)).await;
    expect_refusal(&mut client, "unauthorized", Some(4003)).await;
    server.stop().await;

    let config = Config {
        auth: AuthConfig {
            jwks_file: Some(keys().join("jwks.json")),
            ..AuthConfig::default()
        },
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let token = sign(Algorithm::RS256, &rsa, &grant, Some("test-rsa-1"));
    let mut client = connect_with(&server, "", Some(&token)).await;
    subscribe(&mut client, "a/b").await;
    let unknown_kid = sign(Algorithm::RS256, &rsa, &grant, Some("rotated-away"));
    let mut client = connect_with(&server, "", Some(&unknown_kid)).await;
    expect_refusal(&mut client, "unauthorized", Some(4003)).await;
    server.stop().await;
}

#[tokio::test]
async fn http_publish_and_metrics_need_credentials() {
    let secrets = Secrets::new("http");
    let server = TestServer::start(secrets.config()).await;
    let addr = server.addr;
    let token = fx_token();
    let bearer = format!("Bearer {token}");
    let admin = format!("Bearer {ADMIN_KEY}");
    let post = |path: &'static str, auth: Option<String>| async move {
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        http(addr, "POST", path, &headers, b"x").await
    };
    assert_eq!(post("/api/publish/orders/desk1/1", None).await.0, 401);
    assert_eq!(
        post("/api/publish/orders/desk1/1", Some("Bearer nope".into()))
            .await
            .0,
        401
    );
    let (status, body) = post("/api/publish/orders/desk2/1", Some(bearer.clone())).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("forbidden"), "{body}");
    assert_eq!(
        post("/api/publish/orders/desk1/1", Some(bearer.clone()))
            .await
            .0,
        200
    );
    assert_eq!(
        post("/api/publish/anything/at/all", Some(admin.clone()))
            .await
            .0,
        200
    );

    assert_eq!(http(addr, "GET", "/metrics", &[], &[]).await.0, 401);
    let (status, _) = http(addr, "GET", "/metrics", &[("Authorization", &bearer)], &[]).await;
    assert_eq!(status, 403);
    let (status, body) = http(addr, "GET", "/metrics", &[("Authorization", &admin)], &[]).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("herald_request_errors_total{code=\"unauthorized\"} 3"),
        "{body}"
    );
    // Health stays open for load balancers.
    assert_eq!(http(addr, "GET", "/healthz", &[], &[]).await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn browsers_from_other_origins_are_refused_when_auth_is_on() {
    let secrets = Secrets::new("origin");
    let server = TestServer::start(secrets.config()).await;
    let attempt = |origin: &'static str| {
        let url = server.url();
        let host = server.addr.to_string();
        async move {
            let mut request = url.into_client_request().unwrap();
            request
                .headers_mut()
                .insert("origin", origin.parse().unwrap());
            request.headers_mut().insert("host", host.parse().unwrap());
            tokio_tungstenite::connect_async(request).await.map(|_| ())
        }
    };
    let err = attempt("https://evil.example").await.unwrap_err();
    assert!(err.to_string().contains("403"), "{err}");
    let same = format!("http://{}", server.addr);
    let same: &'static str = Box::leak(same.into_boxed_str());
    attempt(same).await.expect("same origin is allowed");
    server.stop().await;
}

#[tokio::test]
async fn with_auth_off_everything_is_allowed_and_auth_is_acknowledged() {
    let server = TestServer::start(Config::default()).await;
    let mut client = server.connect().await;
    let reply = ask(&mut client, json!({"op": "auth", "token": "anything"})).await;
    assert_eq!(reply, json!({"op": "authed", "id": 1}));
    subscribe(&mut client, ">").await;
    let text = [("Content-Type", "text/plain")];
    let (status, _) = http(server.addr, "POST", "/api/publish/a/b", &text, b"x").await;
    assert_eq!(status, 200);
    let msg = recv_json(&mut client).await;
    assert_eq!(msg["topic"], "a/b");
    // A cross-origin page may connect (the open, development default).
    let mut request = server.url().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("origin", "https://elsewhere.example".parse().unwrap());
    let (mut other, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    subscribe(&mut other, "x").await;
    server.stop().await;
}

/// A one-route HTTP server answering every request with the current `document`.
async fn serve_jwks(document: std::sync::Arc<parking_lot::Mutex<String>>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = document.lock().clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_jwks_url_is_fetched_and_refreshed_so_rotated_keys_work() {
    let document = std::sync::Arc::new(parking_lot::Mutex::new(r#"{"keys":[]}"#.to_owned()));
    let jwks = serve_jwks(document.clone()).await;
    let config = Config {
        auth: AuthConfig {
            jwks_url: Some(format!("http://{jwks}/.well-known/jwks.json")),
            jwks_refresh_secs: 1,
            ..AuthConfig::default()
        },
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let rsa =
        EncodingKey::from_rsa_pem(&std::fs::read(keys().join("rsa_private.pem")).unwrap()).unwrap();
    let mut grant = claims(&["a/>"], &[], 60);
    grant.as_object_mut().unwrap().remove("aud");
    let token = sign(Algorithm::RS256, &rsa, &grant, Some("test-rsa-1"));
    // The key is not published yet.
    let mut early = connect_with(&server, "", Some(&token)).await;
    let reply = expect_refusal(&mut early, "unauthorized", Some(4003)).await;
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("no configured key"),
        "{reply}"
    );
    // Publish it; within a refresh period the same token is accepted.
    *document.lock() = std::fs::read_to_string(keys().join("jwks.json")).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut later = connect_with(&server, "", Some(&token)).await;
    subscribe(&mut later, "a/b").await;
    server.stop().await;
}

#[tokio::test]
async fn a_connection_that_never_authenticates_is_closed_4003() {
    let secrets = Secrets::new("silent");
    let mut config = secrets.config();
    config.limits.handshake_timeout_secs = 1;
    let server = TestServer::start(config).await;
    let mut silent = server.connect().await;
    let started = std::time::Instant::now();
    let frame = close_frame(&mut silent).await.expect("a close frame");
    assert_eq!(u16::from(frame.code), 4003);
    assert_eq!(frame.reason.as_str(), "unauthorized");
    assert!(started.elapsed() < Duration::from_secs(3));
    server.stop().await;
}
