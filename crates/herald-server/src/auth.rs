//! Authentication and topic permissions (docs/security.md).
//!
//! Off unless a key is configured. When on, a connection (or an HTTP publish) presents a JWT:
//! its signature is checked against the configured keys (HS256 secret, RS256/ES256 PEM public
//! keys, a JWKS file or URL), its `exp`/`nbf`/`iss`/`aud` against the config, and its `herald` claim
//! becomes the connection's [`Grants`]. The admin API key is a separate shared secret for admin
//! endpoints and server-side publishing.

use anyhow::{bail, Context};
use herald_core::grant::Grants;
use herald_core::policy::Policy;
use herald_core::reply::Reply;
use herald_core::request::{ProtocolError, Request};
use herald_core::topic;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::time::Instant;

/// The `[auth]` section of the config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File holding the HS256 shared secret (its bytes, trailing newline ignored).
    pub hs256_secret_file: Option<PathBuf>,
    /// PEM file of an RSA public key; tokens signed RS256.
    pub rs256_public_key_file: Option<PathBuf>,
    /// PEM file of an EC P-256 public key; tokens signed ES256.
    pub es256_public_key_file: Option<PathBuf>,
    /// A JWKS document (`{"keys":[...]}`); a token's `kid` picks the key.
    pub jwks_file: Option<PathBuf>,
    /// A JWKS document fetched over plain `http://` (an identity provider's endpoint reached
    /// through a local sidecar or proxy), at start and then every `jwks_refresh_secs`.
    pub jwks_url: Option<String>,
    /// How often the JWKS URL is fetched again, so rotated keys are picked up (seconds).
    pub jwks_refresh_secs: u64,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required `aud`, if set. When unset, tokens that carry an `aud` are refused (RFC 7519 4.1.3).
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf` (seconds).
    pub leeway_secs: u64,
    /// File holding the admin API key, for `/metrics` and HTTP publishing as an operator.
    pub admin_api_key_file: Option<PathBuf>,
    /// Origins (`https://app.example.com`) browsers may connect from; `*` allows any. Empty means
    /// the page's own origin when auth is on, and any origin when it is off.
    pub allowed_origins: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            hs256_secret_file: None,
            rs256_public_key_file: None,
            es256_public_key_file: None,
            jwks_file: None,
            jwks_url: None,
            jwks_refresh_secs: 300,
            issuer: None,
            audience: None,
            leeway_secs: 30,
            admin_api_key_file: None,
            allowed_origins: Vec::new(),
        }
    }
}

impl AuthConfig {
    /// Auth is on when any token key is configured.
    pub fn enabled(&self) -> bool {
        self.hs256_secret_file.is_some()
            || self.rs256_public_key_file.is_some()
            || self.es256_public_key_file.is_some()
            || self.jwks_file.is_some()
            || self.jwks_url.is_some()
    }
}

/// What a verified token lets its holder do, and until when.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    pub grants: Grants,
    /// `exp`, UNIX seconds.
    pub exp: u64,
    /// The token's `sub`: a refresh must keep it, so a connection cannot change identity.
    pub subject: Option<String>,
}

/// Why a token was refused: the message goes to the client as an `unauthorized` error.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct Refused(pub String);

/// The claims herald reads; any other claim is ignored.
#[derive(Deserialize)]
struct Claims {
    /// Required (checked by the validation); optional here so its absence is reported as such.
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    herald: HeraldClaim,
}

/// `"herald": {"sub": [patterns], "pub": [patterns], "lossless": [patterns]}`.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeraldClaim {
    #[serde(default)]
    pub sub: Vec<String>,
    #[serde(default, rename = "pub")]
    pub publish: Vec<String>,
    /// Where the holder may subscribe `lossless` (and so hold publishers).
    #[serde(default)]
    pub lossless: Vec<String>,
}

struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

pub struct Authenticator {
    keys: Vec<Key>,
    /// The keys last fetched from `jwks_url`, swapped whole on each refresh.
    fetched: RwLock<Arc<Vec<Key>>>,
    jwks_url: Option<String>,
    jwks_refresh: Duration,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_secs: u64,
    admin_key: Option<String>,
    allowed_origins: Vec<String>,
}

impl Authenticator {
    /// Loads the keys the config names; `None` when auth is off.
    pub fn from_config(config: &AuthConfig) -> anyhow::Result<Option<Authenticator>> {
        if !config.enabled() {
            if config.admin_api_key_file.is_some() {
                bail!("auth.admin_api_key_file is set but no token key is: configure one (e.g. auth.hs256_secret_file) to turn auth on");
            }
            return Ok(None);
        }
        if config.leeway_secs > MAX_LEEWAY_SECS {
            bail!(
                "auth.leeway_secs is {}; at most {MAX_LEEWAY_SECS} (a day) of clock skew is accepted",
                config.leeway_secs
            );
        }
        let mut keys = Vec::new();
        if let Some(path) = &config.hs256_secret_file {
            let secret = read_secret(path)?;
            if secret.len() < 32 {
                bail!(
                    "the HS256 secret in {} is {} bytes; use at least 32 random bytes",
                    path.display(),
                    secret.len()
                );
            }
            keys.push(Key {
                kid: None,
                algorithm: Algorithm::HS256,
                key: DecodingKey::from_secret(secret.as_bytes()),
            });
        }
        if let Some(path) = &config.rs256_public_key_file {
            let pem = read(path)?;
            keys.push(Key {
                kid: None,
                algorithm: Algorithm::RS256,
                key: DecodingKey::from_rsa_pem(&pem)
                    .with_context(|| format!("{} is not an RSA public key PEM", path.display()))?,
            });
        }
        if let Some(path) = &config.es256_public_key_file {
            let pem = read(path)?;
            keys.push(Key {
                kid: None,
                algorithm: Algorithm::ES256,
                key: DecodingKey::from_ec_pem(&pem)
                    .with_context(|| format!("{} is not an EC public key PEM", path.display()))?,
            });
        }
        if let Some(path) = &config.jwks_file {
            keys.extend(
                jwks_keys(&read(path)?)
                    .with_context(|| format!("{} is not a usable JWKS document", path.display()))?,
            );
        }
        let admin_key = match &config.admin_api_key_file {
            Some(path) => Some(read_secret(path)?),
            None => None,
        };
        Ok(Some(Authenticator {
            keys,
            fetched: RwLock::new(Arc::new(Vec::new())),
            jwks_url: config.jwks_url.clone(),
            jwks_refresh: Duration::from_secs(config.jwks_refresh_secs.max(1)),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            leeway_secs: config.leeway_secs,
            admin_key,
            allowed_origins: config.allowed_origins.clone(),
        }))
    }

    /// Verifies a token and reads its grants.
    pub fn verify(&self, token: &str) -> Result<Verified, Refused> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Refused(format!("malformed token: {e}")))?;
        let fetched = self.fetched.read().clone();
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .chain(fetched.iter())
            .filter(|k| k.algorithm == header.alg)
            .filter(|k| header.kid.is_none() || k.kid.is_none() || k.kid == header.kid)
            .collect();
        if candidates.is_empty() {
            return Err(Refused(format!(
                "no configured key accepts {:?} tokens{}",
                header.alg,
                header
                    .kid
                    .map(|k| format!(" with kid {k:?}"))
                    .unwrap_or_default()
            )));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway_secs;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        if let Some(aud) = &self.audience {
            validation.set_audience(&[aud]);
            validation.required_spec_claims.insert("aud".into());
        }
        let mut last = None;
        for key in candidates {
            match jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => return session(data.claims),
                Err(e) => last = Some(e),
            }
        }
        Err(refusal(last.expect("at least one candidate was tried")))
    }

    /// Fetches the JWKS URL, if one is configured, and replaces the fetched keys.
    pub async fn refresh_jwks(&self) -> anyhow::Result<()> {
        let Some(url) = &self.jwks_url else {
            return Ok(());
        };
        let document = crate::jwks::fetch(url).await?;
        let keys = jwks_keys(&document)
            .with_context(|| format!("{url} did not return a usable JWKS document"))?;
        *self.fetched.write() = Arc::new(keys);
        Ok(())
    }

    /// Refreshes the JWKS keys every `jwks_refresh_secs` (every 10 s while failing), until the
    /// process exits. Does nothing without a JWKS URL.
    pub fn spawn_jwks_refresh(self: &Arc<Self>) {
        if self.jwks_url.is_none() {
            return;
        }
        let auth = self.clone();
        tokio::spawn(async move {
            let mut wait = auth.jwks_refresh;
            loop {
                tokio::time::sleep(wait).await;
                wait = match auth.refresh_jwks().await {
                    Ok(()) => auth.jwks_refresh,
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "JWKS refresh failed; keeping the keys held");
                        auth.jwks_refresh.min(Duration::from_secs(10))
                    }
                };
            }
        });
    }

    /// Does `presented` equal the admin API key? Compared in constant time.
    pub fn is_admin_key(&self, presented: &str) -> bool {
        self.admin_key.as_deref().is_some_and(|key| {
            key.len() == presented.len()
                && key
                    .bytes()
                    .zip(presented.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        })
    }

    /// Who is calling an HTTP endpoint: the operator (admin API key) or a token holder, both
    /// presented as `Authorization: Bearer …`.
    pub fn http_caller(&self, headers: &axum::http::HeaderMap) -> Result<Caller, Refused> {
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .ok_or_else(|| {
                Refused(
                    "authentication is on: send Authorization: Bearer <token or admin key>".into(),
                )
            })?;
        if self.is_admin_key(presented) {
            return Ok(Caller::Admin);
        }
        self.verify(presented).map(Caller::Token)
    }

    /// May a browser page from `origin` connect to `host`? With no list, only its own origin.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        origin_allowed(&self.allowed_origins, origin, host, false)
    }
}

/// Who made an HTTP request.
pub enum Caller {
    Admin,
    Token(Verified),
}

/// A token lapsing later than this sets no deadline on its connection.
const FOREVER: Duration = Duration::from_secs(366 * 24 * 3600);

/// Most clock skew `auth.leeway_secs` may tolerate.
const MAX_LEEWAY_SECS: u64 = 24 * 3600;

/// When a connection must be closed unless something changes first, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deadline {
    pub at: Instant,
    pub code: u16,
    pub reason: &'static str,
}

/// What to do with a request, as far as authentication and permissions go.
#[derive(Debug)]
pub enum Admit {
    /// Hand it to the engine.
    Pass,
    /// Answered here (an `auth` request or a refusal); the connection stays.
    Reply(Reply),
    /// Refused, and the connection must close with 4003 after this reply.
    Close(Reply),
}

/// One connection's standing: the token it presented (if auth is on) and the deadline by which
/// it must present or refresh one.
pub struct Access {
    auth: Option<Arc<Authenticator>>,
    session: Option<Verified>,
    /// Only with auth on: a watch channel is ~400 bytes that every connection would hold.
    deadline: Option<watch::Sender<Option<Deadline>>>,
}

impl Access {
    /// A new connection. With auth on and no token yet, it has `auth_timeout` to send one.
    pub fn new(auth: Option<Arc<Authenticator>>, auth_timeout: Duration) -> Access {
        let deadline = auth.as_ref().map(|_| {
            watch::Sender::new(Some(Deadline {
                at: Instant::now() + auth_timeout,
                code: 4003,
                reason: "unauthorized",
            }))
        });
        Access {
            auth,
            session: None,
            deadline,
        }
    }

    /// The deadline, watched by the session so that a refresh moves it; `None` with auth off,
    /// when there is never one.
    pub fn deadline(&self) -> Option<watch::Receiver<Option<Deadline>>> {
        self.deadline.as_ref().map(watch::Sender::subscribe)
    }

    /// Whether the connection has presented a valid token (always true with auth off).
    pub fn is_authenticated(&self) -> bool {
        self.auth.is_none() || self.session.is_some()
    }

    /// The subject (`sub`) of the token presented, if any.
    pub fn subject(&self) -> Option<&str> {
        self.session.as_ref()?.subject.as_deref()
    }

    /// Takes a token (from the upgrade request or an `auth` message); replaces any earlier one.
    pub fn present(&mut self, token: &str) -> Result<Option<u64>, Refused> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let session = auth.verify(token)?;
        if let Some(old) = &self.session {
            if old.subject != session.subject {
                return Err(Refused(format!(
                    "a refreshed token must have the same subject ({:?}) as the first",
                    old.subject.as_deref().unwrap_or("")
                )));
            }
        }
        // A signed `exp` may be any u64: saturate, and set no deadline for a token that outlives
        // any connection (past a year), where Instant arithmetic could overflow.
        let lapses = session.exp.saturating_add(auth.leeway_secs);
        let left = Duration::from_secs(lapses.saturating_sub(unix_now()));
        if let Some(deadline) = &self.deadline {
            deadline.send_replace((left <= FOREVER).then(|| Deadline {
                at: Instant::now() + left,
                code: 4001,
                reason: "token expired",
            }));
        }
        let exp = session.exp;
        self.session = Some(session);
        Ok(Some(exp))
    }

    /// Checks one request against the connection's token and grants.
    pub fn admit(&mut self, request: &Request) -> Admit {
        let refuse = |id: &Option<serde_json::Value>, code: &'static str, message: String| {
            Reply::from(ProtocolError::new(code, message).with_id(id.clone()))
        };
        if let Request::Auth { id, token } = request {
            let authenticated = self.session.is_some();
            return match self.present(token) {
                Ok(exp) => Admit::Reply(Reply::Authed {
                    id: id.clone(),
                    exp,
                }),
                Err(Refused(why)) if authenticated => Admit::Reply(refuse(id, "unauthorized", why)),
                Err(Refused(why)) => Admit::Close(refuse(id, "unauthorized", why)),
            };
        }
        if self.auth.is_none() {
            return Admit::Pass;
        }
        let Some(session) = &self.session else {
            return Admit::Close(refuse(
                &request_id(request),
                "unauthorized",
                "authenticate first: send {\"op\":\"auth\",\"token\":\"…\"} or connect with ?token= or an Authorization: Bearer header".into(),
            ));
        };
        match request {
            Request::Subscribe(s) if !session.grants.may_subscribe(&s.topic) => {
                Admit::Reply(refuse(
                    &s.id,
                    "forbidden",
                    format!(
                        "your token does not grant subscribing to {:?}: it must lie within one of {:?}",
                        s.topic, session.grants.subscribe
                    ),
                ))
            }
            Request::Subscribe(s)
                if s.policy == Some(Policy::Lossless) && !session.grants.may_hold(&s.topic) =>
            {
                Admit::Reply(refuse(
                    &s.id,
                    "forbidden",
                    format!(
                        "your token does not grant lossless subscriptions to {:?} (a lossless subscriber holds publishers): it must lie within one of its \"lossless\" grants {:?}; subscribe with another policy",
                        s.topic, session.grants.lossless
                    ),
                ))
            }
            Request::Publish(p) if !session.grants.may_publish(&p.topic) => Admit::Reply(refuse(
                &p.id,
                "forbidden",
                format!(
                    "your token does not grant publishing to {:?}; it grants {:?}",
                    p.topic, session.grants.publish
                ),
            )),
            _ => Admit::Pass,
        }
    }
}

fn request_id(request: &Request) -> Option<serde_json::Value> {
    match request {
        Request::Subscribe(s) => s.id.clone(),
        Request::Publish(p) => p.id.clone(),
        Request::Unsubscribe { id, .. }
        | Request::Ping { id }
        | Request::Auth { id, .. }
        | Request::Credit { id, .. } => id.clone(),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The credential in an `Authorization: Bearer …` value (the scheme is case-insensitive).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(credential.trim())
        .filter(|c| !c.is_empty())
}

/// The Origin rule, shared with auth-off servers (where an empty list allows any origin).
pub fn origin_allowed(allowed: &[String], origin: &str, host: Option<&str>, open: bool) -> bool {
    if allowed.is_empty() {
        let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        return open || host.is_some_and(|h| h.eq_ignore_ascii_case(authority));
    }
    allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
}

fn session(claims: Claims) -> Result<Verified, Refused> {
    let herald = claims.herald;
    for pattern in herald
        .sub
        .iter()
        .chain(&herald.publish)
        .chain(&herald.lossless)
    {
        topic::validate_pattern(pattern)
            .map_err(|e| Refused(format!("the token grants an invalid pattern: {e}")))?;
    }
    Ok(Verified {
        grants: Grants {
            subscribe: herald.sub,
            publish: herald.publish,
            lossless: herald.lossless,
        },
        exp: claims
            .exp
            .ok_or_else(|| Refused("token lacks the required claim \"exp\"".into()))?,
        subject: claims.sub,
    })
}

fn refusal(e: jsonwebtoken::errors::Error) -> Refused {
    use jsonwebtoken::errors::ErrorKind as K;
    Refused(match e.kind() {
        K::ExpiredSignature => "token expired".into(),
        K::ImmatureSignature => "token not valid yet (nbf is in the future)".into(),
        K::InvalidSignature => "bad token signature".into(),
        K::InvalidAudience => "token audience (aud) is not this server's".into(),
        K::InvalidIssuer => "token issuer (iss) is not trusted".into(),
        K::MissingRequiredClaim(c) => format!("token lacks the required claim {c:?}"),
        K::InvalidAlgorithm => "token algorithm does not match its key".into(),
        _ => format!("invalid token: {e}"),
    })
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn read_secret(path: &Path) -> anyhow::Result<String> {
    let text = String::from_utf8(read(path)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    let secret = text.trim_end_matches(['\r', '\n']).to_owned();
    if secret.is_empty() {
        bail!("{} is empty", path.display());
    }
    Ok(secret)
}

/// The keys of a JWKS document: each with its `kid` and algorithm (`alg`, else RS256 for RSA
/// and ES256 for EC keys).
fn jwks_keys(document: &[u8]) -> anyhow::Result<Vec<Key>> {
    use jsonwebtoken::jwk::AlgorithmParameters as P;
    let set: JwkSet = serde_json::from_slice(document)?;
    set.keys
        .iter()
        .map(|jwk| {
            let algorithm = match (&jwk.common.key_algorithm, &jwk.algorithm) {
                (Some(alg), _) => alg.to_string().parse()?,
                (None, P::RSA(_)) => Algorithm::RS256,
                (None, P::EllipticCurve(_)) => Algorithm::ES256,
                (None, _) => bail!("a key without `alg` that is neither RSA nor EC"),
            };
            Ok(Key {
                kid: jwk.common.key_id.clone(),
                algorithm,
                key: DecodingKey::from_jwk(jwk)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_far_future_exp_does_not_overflow_the_deadline() {
        let dir = std::env::temp_dir().join(format!("herald-auth-exp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = "unit-test-secret-unit-test-secret-0123";
        std::fs::write(dir.join("secret"), secret).unwrap();
        let config = AuthConfig {
            hs256_secret_file: Some(dir.join("secret")),
            ..AuthConfig::default()
        };
        let too_lenient = AuthConfig {
            leeway_secs: u64::MAX,
            ..config.clone()
        };
        assert!(Authenticator::from_config(&too_lenient).is_err());
        let auth = Arc::new(Authenticator::from_config(&config).unwrap().unwrap());
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        for exp in [u64::MAX, u64::MAX / 2, 1 << 40] {
            let claims = serde_json::json!({"exp": exp, "herald": {"sub": ["a"]}});
            let token = jsonwebtoken::encode(&Default::default(), &claims, &key).unwrap();
            let mut access = Access::new(Some(auth.clone()), Duration::from_secs(10));
            assert_eq!(access.present(&token), Ok(Some(exp)));
            let deadline = access.deadline().expect("auth is on");
            assert_eq!(*deadline.borrow(), None, "exp {exp}: no deadline");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn origins() {
        let none: Vec<String> = vec![];
        assert!(origin_allowed(
            &none,
            "https://a.example",
            Some("a.example"),
            false
        ));
        assert!(!origin_allowed(
            &none,
            "https://evil.example",
            Some("a.example"),
            false
        ));
        assert!(origin_allowed(
            &none,
            "https://evil.example",
            Some("a.example"),
            true
        ));
        let list = vec!["https://app.example".to_owned()];
        assert!(origin_allowed(
            &list,
            "https://app.example",
            Some("x"),
            true
        ));
        assert!(!origin_allowed(
            &list,
            "https://evil.example",
            Some("x"),
            true
        ));
        assert!(origin_allowed(&["*".to_owned()], "null", None, false));
    }
}
