//! The stand-in over TCP+TLS, as a client in a pod reaches the API server: certificates made
//! at run time ([`Pki`]: a cluster CA and a serving certificate for the in-cluster names, as
//! kubeadm makes them), and a server ([`TlsServer`]) that runs [`ApiServer`] behind rustls
//! (ring) and hyper's HTTP/1.1, one task per connection, on a runtime of its own, recording
//! failed handshakes in the request log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls;

use super::ApiServer;

/// A cluster CA, the API server's serving certificate signed by it, and a second CA that
/// signed nothing (the wrong `ca.crt` a misconfigured pod would trust). PEM text.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The cluster CA (what the kubelet puts in the pod as `ca.crt`).
    pub ca_pem: String,
    /// A CA that did not sign the server's certificate.
    pub wrong_ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl Pki {
    /// A new CA and a serving certificate for `names` (DNS names and IP addresses, written as
    /// text: `kubernetes.default.svc`, `10.96.0.1`).
    ///
    /// Errors: rcgen's (a name that is neither).
    pub fn generate(names: &[&str]) -> Result<Pki> {
        let ca = |cn: &str| -> Result<(String, Issuer<'static, KeyPair>)> {
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, cn);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
            let key = KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            Ok((cert.pem(), Issuer::new(params, key)))
        };
        let (ca_pem, issuer) = ca("kubernetes")?;
        let (wrong_ca_pem, _) = ca("some other cluster")?;
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Pki { ca_pem, wrong_ca_pem, cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// The rustls server configuration (ring; HTTP/1.1 by ALPN).
    fn server_config(&self) -> Result<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().context("serving certificate")?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).context("serving key")?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The stand-in served over TLS on a listener; stops when dropped.
pub struct TlsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsServer {
    /// Serve `api` over TLS with `pki`'s serving certificate on `listener` (bound by the
    /// caller, e.g. in another network namespace), and send every watch a bookmark each
    /// `bookmark_every` (the API server's watch cache: 1 minute) when given.
    ///
    /// Errors: the certificate or key does not load; the listener cannot be used.
    pub fn start(api: ApiServer, listener: std::net::TcpListener, pki: &Pki, bookmark_every: Option<Duration>) -> Result<TlsServer> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_config()?));
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("standin-tls".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                if let Some(every) = bookmark_every {
                    let api = api.clone();
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                        loop {
                            tick.tick().await;
                            api.bookmark();
                        }
                    });
                }
                let accept = async {
                    loop {
                        let Ok((tcp, peer)) = listener.accept().await else { continue };
                        let (api, acceptor) = (api.clone(), acceptor.clone());
                        tokio::spawn(async move {
                            let tls = match acceptor.accept(tcp).await {
                                Ok(tls) => tls,
                                Err(e) => return api.log().tls_failure(format!("{peer}: {e}")),
                            };
                            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                                let api = api.clone();
                                async move {
                                    let (parts, body) = req.into_parts();
                                    let body = super::events::read_body(body).await;
                                    Ok::<_, std::convert::Infallible>(api.serve(&parts.method, &parts.uri, &parts.headers, &body).await)
                                }
                            });
                            let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(tls), service).await;
                        });
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        })?;
        Ok(TlsServer { addr, stop: Some(stop), thread: Some(thread) })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
