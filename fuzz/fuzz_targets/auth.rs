//! The authentication path: arbitrary bytes as a token, and as the claims of a correctly signed
//! HS256 token (so that claim parsing and grant validation, not just signature checking, see
//! the input), then the grants are exercised on a subscription and a publish.
#![no_main]

use herald_core::request::{Publish, PayloadKind, Request, Subscribe};
use herald_server::auth::{Access, AuthConfig, Authenticator};
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

const SECRET: &[u8] = b"fuzzing-secret-fuzzing-secret-fuzzing";

fn authenticator() -> Arc<Authenticator> {
    static AUTH: OnceLock<Arc<Authenticator>> = OnceLock::new();
    AUTH.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("herald-fuzz-secret-{}", std::process::id()));
        std::fs::write(&path, SECRET).unwrap();
        let config = AuthConfig {
            hs256_secret_file: Some(path),
            ..AuthConfig::default()
        };
        Arc::new(Authenticator::from_config(&config).unwrap().unwrap())
    })
    .clone()
}

fn b64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fuzz_target!(|data: &[u8]| {
    let auth = authenticator();
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = auth.verify(text);
    }
    let signing_input = format!("{}.{}", b64(br#"{"alg":"HS256","typ":"JWT"}"#), b64(data));
    let key = EncodingKey::from_secret(SECRET);
    let signature = jsonwebtoken::crypto::sign(signing_input.as_bytes(), &key, Algorithm::HS256)
        .unwrap();
    let token = format!("{signing_input}.{signature}");
    let mut access = Access::new(Some(auth), std::time::Duration::from_secs(10));
    if access.present(&token).is_ok() {
        let topic = String::from_utf8_lossy(&data[..data.len().min(40)]).into_owned();
        let _ = access.admit(&Request::Subscribe(Subscribe {
            topic: topic.clone(),
            ..Subscribe::default()
        }));
        let _ = access.admit(&Request::Publish(Publish {
            id: None,
            topic: topic.into(),
            payload: bytes::Bytes::new(),
            kind: PayloadKind::Text,
            content_type: None,
            stamp: false,
            extras: None,
        }));
    }
});
