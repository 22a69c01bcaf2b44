//! A cluster's identities: a CA made by `streambatch cluster init`, and a
//! certificate per node signed by it. Nodes speak mutual TLS 1.3 over QUIC:
//! each side must show a certificate of the cluster's CA, so a stranger is
//! refused in the handshake, before any message is read.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::NetError;

/// The name every node certificate is valid for, and that every client
/// checks: nodes are told apart by their certificates' common names, not by
/// their addresses, which change.
pub const SERVER_NAME: &str = "streambatch";

/// The ALPN protocol of streambatch's QUIC connections.
pub(crate) const ALPN: &[u8] = b"streambatch/1";

/// The files of one node's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate (PEM).
    pub ca: PathBuf,
    /// This node's certificate (PEM), signed by the CA.
    pub cert: PathBuf,
    /// This node's private key (PEM); must not be readable by other users.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files `cluster init` wrote for `name` in `dir`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }
}

/// Writes a new cluster CA (`ca.pem`, `ca.key`) and a certificate and key
/// for each name (`NAME.pem`, `NAME.key`) into `dir`, made 0700. Keys are
/// written 0600. Refuses to overwrite an existing CA.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// streambatch_net::init_cluster(dir.path(), &["head", "worker-1"]).unwrap();
/// let files = streambatch_net::TlsFiles::in_dir(dir.path(), "worker-1");
/// assert!(files.cert.exists() && files.key.exists() && files.ca.exists());
/// ```
pub fn init_cluster(dir: &Path, names: &[&str]) -> Result<(), NetError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NetError::Io {
            action: "writing",
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    let ca_path = dir.join("ca.pem");
    if ca_path.exists() {
        return Err(NetError::Tls {
            file: ca_path,
            message: "a cluster CA already exists here; remove it or choose another directory"
                .into(),
        });
    }
    let ca_key = KeyPair::generate().map_err(cert_error(dir))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error(dir))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "streambatch cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = params.self_signed(&ca_key).map_err(cert_error(dir))?;
    let issuer = Issuer::new(params, ca_key);
    for name in names {
        let key = KeyPair::generate().map_err(cert_error(dir))?;
        let mut params =
            CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(cert_error(dir))?;
        params.distinguished_name.push(DnType::CommonName, *name);
        let cert = params.signed_by(&key, &issuer).map_err(cert_error(dir))?;
        let files = TlsFiles::in_dir(dir, name);
        write_file(&files.cert, cert.pem().as_bytes(), 0o644).map_err(io(&files.cert))?;
        write_file(&files.key, key.serialize_pem().as_bytes(), 0o600).map_err(io(&files.key))?;
    }
    let ca_key_path = dir.join("ca.key");
    write_file(&ca_key_path, issuer.key().serialize_pem().as_bytes(), 0o600)
        .map_err(io(&ca_key_path))?;
    // The CA certificate last: its presence says the directory is complete.
    write_file(&ca_path, ca_cert.pem().as_bytes(), 0o644).map_err(io(&ca_path))?;
    Ok(())
}

fn cert_error(dir: &Path) -> impl Fn(rcgen::Error) -> NetError {
    let file = dir.to_path_buf();
    move |e| NetError::Tls {
        file: file.clone(),
        message: format!("generating a certificate: {e}"),
    }
}

/// Creates `path` with `mode` (never wider, whatever the umask) and writes it.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A node's loaded identity: the CA to trust and its own chain and key.
#[derive(Debug)]
pub struct Identity {
    /// Names the cluster: a hash of its CA certificate.
    cluster_id: String,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cluster_id: self.cluster_id.clone(),
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Loads and checks the files: each must exist and parse, and the key
    /// must not be readable by group or others.
    pub fn load(files: &TlsFiles) -> Result<Self, NetError> {
        let bad = |file: &Path, message: String| NetError::Tls {
            file: file.to_path_buf(),
            message,
        };
        let ca: Vec<_> = CertificateDer::pem_file_iter(&files.ca)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| bad(&files.ca, format!("cannot read the CA certificate: {e}")))?;
        let cluster_id = ca
            .first()
            .map(|c| format!("{:08x}", crc32fast::hash(c.as_ref())))
            .unwrap_or_default();
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots
                .add(cert)
                .map_err(|e| bad(&files.ca, format!("not a usable CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(bad(&files.ca, "holds no certificate".into()));
        }
        let chain: Vec<_> = CertificateDer::pem_file_iter(&files.cert)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| bad(&files.cert, format!("cannot read the certificate: {e}")))?;
        if chain.is_empty() {
            return Err(bad(&files.cert, "holds no certificate".into()));
        }
        let mode = std::fs::metadata(&files.key)
            .map_err(|e| bad(&files.key, format!("cannot read the key: {e}")))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(bad(
                &files.key,
                format!(
                    "the key is readable by other users (mode {:o}); run `chmod 600` on it",
                    mode & 0o777
                ),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| bad(&files.key, format!("cannot read the key: {e}")))?;
        Ok(Self {
            cluster_id,
            roots: Arc::new(roots),
            chain,
            key,
        })
    }

    /// This node's name: its certificate's common name.
    pub fn name(&self) -> String {
        self.chain.first().and_then(common_name).unwrap_or_default()
    }

    /// The cluster's id: a hash of its CA certificate, the same on every
    /// node of the cluster and different for another cluster. Names kept
    /// by a process (actor groups) carry it, so that one process can be a
    /// driver of two clusters at once.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// QUIC server settings: TLS 1.3, a client certificate of the CA
    /// required; the endpoint adds its transport settings.
    pub fn server_config(&self) -> Result<quinn::ServerConfig, NetError> {
        let mut tls = self.tls_server_config()?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|e| NetError::Config(e.to_string()))?;
        Ok(quinn::ServerConfig::with_crypto(Arc::new(quic)))
    }

    /// TLS over TCP with the same rule as QUIC (TLS 1.3, a client
    /// certificate of the CA required), for ractor_cluster's own loopback
    /// listener: a local process without the cluster's key material fails
    /// the handshake before any actor session exists.
    pub fn tcp_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, NetError> {
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(
            self.tls_server_config()?,
        )))
    }

    /// A TLS acceptor for gRPC over TCP (Arrow Flight): as
    /// [`tcp_acceptor`](Identity::tcp_acceptor), a client certificate of
    /// the CA required, offering HTTP/2 by ALPN as gRPC clients demand.
    pub fn grpc_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, NetError> {
        let mut config = self.tls_server_config()?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    fn tls_server_config(&self) -> Result<rustls::ServerConfig, NetError> {
        let provider = crate::provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| NetError::Config(format!("client verifier: {e}")))?;
        rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| NetError::Config(format!("this node's certificate: {e}")))
    }

    /// QUIC client settings: the server must show a certificate of the CA
    /// for [`SERVER_NAME`]; this node shows its own.
    pub fn client_config(&self) -> Result<quinn::ClientConfig, NetError> {
        let tls = rustls::ClientConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Config(e.to_string()))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| NetError::Config(format!("this node's certificate: {e}")))?;
        client_from_tls(tls)
    }

    /// A client that trusts the CA but shows no certificate of its own: only
    /// for tests that check such a peer is refused.
    #[doc(hidden)]
    pub fn anonymous_client_config(&self) -> Result<quinn::ClientConfig, NetError> {
        let tls = rustls::ClientConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Config(e.to_string()))?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
        client_from_tls(tls)
    }
}

fn client_from_tls(mut tls: rustls::ClientConfig) -> Result<quinn::ClientConfig, NetError> {
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| NetError::Config(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// The common name of the certificate a peer showed, which names the node.
pub(crate) fn peer_name(connection: &quinn::Connection) -> Option<String> {
    let identity = connection.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    common_name(chain.first()?)
}

/// The subject's common name, parsed as X.509: the one name in the
/// certificate's subject, never a commonName OID found elsewhere in the DER
/// (an extension, the issuer). A subject with no common name, or with two,
/// names no node.
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let mut names = parsed.subject().iter_common_name();
    let name = names.next()?.as_str().ok()?.to_string();
    names.next().is_none().then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_writes_private_keys_and_names_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = dir.path().join("tls");
        init_cluster(&cluster, &["head", "worker-1"]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cluster), 0o700);
        assert_eq!(mode(&cluster.join("ca.key")), 0o600);
        let files = TlsFiles::in_dir(&cluster, "worker-1");
        assert_eq!(mode(&files.key), 0o600);
        let identity = Identity::load(&files).unwrap();
        assert_eq!(common_name(&identity.chain[0]).as_deref(), Some("worker-1"));
        // A second init over the same CA is refused rather than orphaning
        // every node's certificate.
        let err = init_cluster(&cluster, &["x"]).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        // A key others can read is refused, naming the file.
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Identity::load(&files).unwrap_err().to_string();
        assert!(
            err.contains("worker-1.key") && err.contains("chmod 600"),
            "{err}"
        );
    }

    /// A certificate whose extension carries the bytes of a commonName
    /// attribute: the DER walk this replaced read "admin" from it.
    #[test]
    fn the_name_comes_from_the_subject_not_an_extension() {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "worker-1");
        // OID 2.5.4.3, then a UTF8String "admin".
        let smuggled = [
            0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x05, b'a', b'd', b'm', b'i', b'n',
        ];
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 99999, 1],
                smuggled.to_vec(),
            ));
        let cert = params.signed_by(&key, &issuer).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("worker-1"));
        // A torn certificate names no node.
        let mut der = cert.der().to_vec();
        der.truncate(der.len() / 2);
        assert_eq!(common_name(&CertificateDer::from(der)), None);
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles::in_dir(dir.path(), "head");
        let err = Identity::load(&files).unwrap_err().to_string();
        assert!(err.contains("ca.pem"), "{err}");
    }
}
