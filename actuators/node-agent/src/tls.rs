//! Lab certificates (rcgen) and the mutual-TLS server configuration: the agent only talks to
//! clients holding a certificate signed by the lab CA.

use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const SERVER_CERT: &str = "server.pem";
pub const SERVER_KEY: &str = "server.key";
pub const CLIENT_CERT: &str = "client.pem";
pub const CLIENT_KEY: &str = "client.key";

fn write(dir: &Path, name: &str, contents: &str, secret: bool) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 600 {}", path.display()))?;
    }
    Ok(())
}

fn leaf(
    cn: &str,
    sans: &[String],
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "cgloop lab");
    params.distinguished_name = dn;
    for s in sans {
        params.subject_alt_names.push(match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(s.clone().try_into()?),
        });
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes a lab CA, a server certificate for `server_names` (DNS names or IPs) and a client
/// certificate named `client_name` into `dir`. An existing CA in `dir` is reused, so several
/// agents and the policy engine can share one lab CA.
pub fn generate(dir: &Path, server_names: &[String], client_name: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (ca_cert_pem, ca_key) = match (
        std::fs::read_to_string(dir.join(CA_CERT)),
        std::fs::read_to_string(dir.join(CA_KEY)),
    ) {
        (Ok(cert), Ok(key)) => (cert, KeyPair::from_pem(&key).context("parsing the existing ca.key")?),
        _ => {
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "cgloop lab CA");
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let key = KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            write(dir, CA_CERT, &cert.pem(), false)?;
            write(dir, CA_KEY, &key.serialize_pem(), true)?;
            (cert.pem(), key)
        }
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).context("loading the lab CA")?;
    let (cert, key) = leaf(&server_names[0], server_names, ExtendedKeyUsagePurpose::ServerAuth, &issuer)?;
    write(dir, SERVER_CERT, &cert, false)?;
    write(dir, SERVER_KEY, &key, true)?;
    let (cert, key) = leaf(client_name, &[], ExtendedKeyUsagePurpose::ClientAuth, &issuer)?;
    write(dir, CLIENT_CERT, &cert, false)?;
    write(dir, CLIENT_KEY, &key, true)?;
    Ok(())
}

/// Server TLS that requires a client certificate from the lab CA.
pub fn server_config(dir: &Path) -> Result<ServerTlsConfig> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).with_context(|| {
            format!("reading {} (create lab certificates with `cgloop-node-agent certs`)", p.display())
        })
    };
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(read(SERVER_CERT)?, read(SERVER_KEY)?))
        .client_ca_root(Certificate::from_pem(read(CA_CERT)?))
        .client_auth_optional(false))
}
