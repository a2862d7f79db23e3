//! `herald token`: mints an HS256 token with a `herald` grant claim, for scripts, tests and
//! development. Production tokens come from the application's own auth service, which signs
//! the same claims (docs/security.md).

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct TokenArgs {
    /// File holding the HS256 secret (the same file the server's auth.hs256_secret_file names)
    #[arg(long, value_name = "FILE")]
    secret_file: PathBuf,
    /// Patterns the holder may subscribe within, e.g. 'quotes/fx/>'
    #[arg(long = "sub", value_name = "PATTERN", num_args = 1..)]
    sub: Vec<String>,
    /// Topics or patterns the holder may publish to
    #[arg(long = "pub", value_name = "PATTERN", num_args = 1..)]
    publish: Vec<String>,
    /// Patterns within which the holder may subscribe `lossless` (making publishers wait for its
    /// credit)
    #[arg(long = "lossless", value_name = "PATTERN", num_args = 1..)]
    lossless: Vec<String>,
    /// Seconds until the token expires
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// The `sub` (subject) claim: who holds the token
    #[arg(long)]
    subject: Option<String>,
    /// The `iss` claim
    #[arg(long)]
    iss: Option<String>,
    /// The `aud` claim
    #[arg(long)]
    aud: Option<String>,
}

pub fn run(args: TokenArgs) -> anyhow::Result<()> {
    for pattern in args.sub.iter().chain(&args.publish).chain(&args.lossless) {
        herald_core::topic::validate_pattern(pattern)
            .with_context(|| format!("cannot grant {pattern:?}"))?;
    }
    let secret = std::fs::read_to_string(&args.secret_file)
        .with_context(|| format!("cannot read {}", args.secret_file.display()))?;
    let secret = secret.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        bail!("{} is empty", args.secret_file.display());
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let mut claims = json!({
        "iat": now,
        "exp": now + args.ttl,
        "herald": {"sub": args.sub, "pub": args.publish, "lossless": args.lossless},
    });
    for (name, value) in [("sub", args.subject), ("iss", args.iss), ("aud", args.aud)] {
        if let Some(value) = value {
            claims[name] = value.into();
        }
    }
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )?;
    println!("{token}");
    Ok(())
}
