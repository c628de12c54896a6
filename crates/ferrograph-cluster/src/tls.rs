//! Who may talk to a node: loopback only, unless TLS is configured.
//!
//! ractor_cluster authenticates peers with a shared secret (the cookie) but sends everything
//! in clear unless its streams are TLS. So a node listens on a non-loopback address, or joins
//! one, only with TLS configured: a certificate and key of its own and the certificate
//! authority that signed every node's certificate. Both sides check each other's certificate
//! (mutual TLS), and the cookie is still required on top.

use crate::error::ClusterError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// The PEM files of a node's TLS identity.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The node's certificate chain.
    pub cert: PathBuf,
    /// The node's private key.
    pub key: PathBuf,
    /// The authority that signed every node's certificate.
    pub ca: PathBuf,
    /// The name to expect in the certificates of nodes this one joins (default: the host of
    /// the joined address).
    pub server_name: Option<String>,
}

/// A loaded TLS identity: what accepts and what opens connections.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(format!("{what}: {e}"))
}

impl Tls {
    /// Reads the PEM files and builds both sides' configurations.
    pub(crate) fn load(files: &TlsFiles) -> Result<Self, ClusterError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| tls_err(&format!("reading {}", files.cert.display()), e))?
            .collect::<Result<_, _>>()
            .map_err(|e| tls_err(&format!("reading {}", files.cert.display()), e))?;
        if certs.is_empty() {
            return Err(tls_err(
                &files.cert.display().to_string(),
                "no certificate in the file",
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| tls_err(&format!("reading {}", files.key.display()), e))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| tls_err(&format!("reading {}", files.ca.display()), e))?
        {
            let ca = ca.map_err(|e| tls_err(&format!("reading {}", files.ca.display()), e))?;
            roots
                .add(ca)
                .map_err(|e| tls_err(&format!("the authority in {}", files.ca.display()), e))?;
        }
        if roots.is_empty() {
            return Err(tls_err(
                &files.ca.display().to_string(),
                "no certificate authority in the file",
            ));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls_err("client verifier", e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("server protocol versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| tls_err("the node's certificate and key", e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("client protocol versions", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| tls_err("the node's certificate and key", e))?;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            server_name: files.server_name.clone(),
        })
    }

    /// The name to check in the certificate of the node at `host`.
    pub(crate) fn name_for(&self, host: &str) -> Result<ServerName<'static>, ClusterError> {
        let name = self.server_name.clone().unwrap_or_else(|| host.to_string());
        ServerName::try_from(name.clone())
            .map_err(|e| tls_err(&format!("the server name `{name}`"), e))
    }
}

/// Refuses a non-loopback address when there is no TLS.
pub(crate) fn check_address(
    what: &'static str,
    addr: &SocketAddr,
    tls: bool,
) -> Result<(), ClusterError> {
    if tls || addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(ClusterError::InsecureAddress {
            what,
            addr: addr.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_allowed_and_anything_else_needs_tls() {
        let lo: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let lo6: SocketAddr = "[::1]:7400".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let lan: SocketAddr = "192.168.1.20:7400".parse().unwrap();
        assert!(check_address("listening on", &lo, false).is_ok());
        assert!(check_address("listening on", &lo6, false).is_ok());
        for addr in [any, lan] {
            let err = check_address("listening on", &addr, false).unwrap_err();
            assert!(err.to_string().contains("TLS"), "{err}");
            assert!(check_address("listening on", &addr, true).is_ok());
        }
    }

    #[test]
    fn missing_files_are_named() {
        let files = TlsFiles {
            cert: "/nonexistent/node.pem".into(),
            key: "/nonexistent/node.key".into(),
            ca: "/nonexistent/ca.pem".into(),
            server_name: None,
        };
        let err = Tls::load(&files).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/node.pem"), "{err}");
    }
}
