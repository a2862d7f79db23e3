//! TLS on the listener (rustls): the certificate and key come from PEM files and are re-read on
//! SIGHUP, so a renewed certificate takes effect without dropping a single connection (open
//! connections keep the session they negotiated; new handshakes use the new certificate).

use anyhow::{bail, Context};
use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The `[tls]` section of the config: both paths, or neither (plain HTTP).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

/// The acceptor in force, swapped whole on reload.
pub struct Tls {
    cert_file: PathBuf,
    key_file: PathBuf,
    acceptor: RwLock<TlsAcceptor>,
}

impl Tls {
    /// Loads the certificate and key; `None` when TLS is not configured.
    pub fn from_config(config: &TlsConfig) -> anyhow::Result<Option<Arc<Tls>>> {
        let (cert_file, key_file) = match (&config.cert_file, &config.key_file) {
            (None, None) => return Ok(None),
            (Some(c), Some(k)) => (c.clone(), k.clone()),
            _ => bail!("tls.cert_file and tls.key_file must be set together"),
        };
        let acceptor = load(&cert_file, &key_file)?;
        Ok(Some(Arc::new(Tls {
            cert_file,
            key_file,
            acceptor: RwLock::new(acceptor),
        })))
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().clone()
    }

    /// Re-reads the files; on failure keeps the certificate in force and says why.
    pub fn reload(&self) -> anyhow::Result<()> {
        let acceptor = load(&self.cert_file, &self.key_file)?;
        *self.acceptor.write() = acceptor;
        Ok(())
    }

    /// Reloads on every SIGHUP until the process exits.
    pub fn reload_on_sighup(self: &Arc<Self>) -> anyhow::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
        let tls = self.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match tls.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %tls.cert_file.display(), "TLS certificate reloaded")
                    }
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "TLS reload failed; keeping the previous certificate")
                    }
                }
            }
        });
        Ok(())
    }
}

fn load(cert_file: &Path, key_file: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .with_context(|| format!("cannot read {}", cert_file.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate chain", cert_file.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", cert_file.display());
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("cannot read a PEM private key from {}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not form a usable pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
