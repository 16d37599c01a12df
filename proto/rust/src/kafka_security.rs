//! How cgloop's Rust producers authenticate to Kafka: the same `CGLOOP_KAFKA_*` variables the
//! Python clients read (`KafkaClientSecurity` in core/src/cgloop/config.py), turned into the
//! librdkafka properties every binary sets on its `ClientConfig`. Kept free of rdkafka so the
//! contract crate stays light: callers apply `properties()` with `ClientConfig::set`.

use std::fmt;
use std::path::{Path, PathBuf};

pub const PROTOCOLS: [&str; 4] = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
pub const MECHANISMS: [&str; 3] = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"];
pub const DEFAULT_MECHANISM: &str = "SCRAM-SHA-512";

pub const VAR_PROTOCOL: &str = "CGLOOP_KAFKA_SECURITY_PROTOCOL";
pub const VAR_MECHANISM: &str = "CGLOOP_KAFKA_SASL_MECHANISM";
pub const VAR_USERNAME: &str = "CGLOOP_KAFKA_SASL_USERNAME";
pub const VAR_PASSWORD: &str = "CGLOOP_KAFKA_SASL_PASSWORD";
pub const VAR_PASSWORD_FILE: &str = "CGLOOP_KAFKA_SASL_PASSWORD_FILE";
pub const VAR_CA: &str = "CGLOOP_KAFKA_SSL_CA_LOCATION";
pub const VAR_CERT: &str = "CGLOOP_KAFKA_SSL_CERTIFICATE_LOCATION";
pub const VAR_KEY: &str = "CGLOOP_KAFKA_SSL_KEY_LOCATION";

const SASL_VARS: [&str; 4] = [VAR_MECHANISM, VAR_USERNAME, VAR_PASSWORD, VAR_PASSWORD_FILE];
const SSL_VARS: [&str; 3] = [VAR_CA, VAR_CERT, VAR_KEY];

/// A wrong security setting; the message names the variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSecurityError(pub String);

impl fmt::Display for KafkaSecurityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KafkaSecurityError {}

fn err<T>(message: String) -> Result<T, KafkaSecurityError> {
    Err(KafkaSecurityError(message))
}

/// The librdkafka security properties of one client. `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    props: Vec<(&'static str, String)>,
}

impl fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<(&str, &str)> = self
            .props
            .iter()
            .map(|(k, v)| {
                (
                    *k,
                    if *k == "sasl.password" {
                        "<redacted>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        f.debug_struct("KafkaSecurity")
            .field("props", &shown)
            .finish()
    }
}

impl KafkaSecurity {
    /// From the process environment.
    pub fn from_env() -> Result<Self, KafkaSecurityError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From any variable lookup (tests pass a map); empty values count as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, KafkaSecurityError> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let Some(raw) = var(VAR_PROTOCOL) else {
            if let Some(name) = SASL_VARS.iter().chain(&SSL_VARS).find(|n| var(n).is_some()) {
                return err(format!(
                    "{name} is set but {VAR_PROTOCOL} is not; set it to one of {}",
                    PROTOCOLS.join(", ")
                ));
            }
            return Ok(Self::default());
        };
        let protocol = raw.trim().to_ascii_uppercase();
        if !PROTOCOLS.contains(&protocol.as_str()) {
            return err(format!(
                "{VAR_PROTOCOL}={raw:?} is not one of {}",
                PROTOCOLS.join(", ")
            ));
        }
        let mut props = vec![("security.protocol", protocol.clone())];
        if protocol.starts_with("SASL_") {
            let mechanism = var(VAR_MECHANISM)
                .map(|m| m.trim().to_ascii_uppercase())
                .unwrap_or_else(|| DEFAULT_MECHANISM.to_string());
            if !MECHANISMS.contains(&mechanism.as_str()) {
                return err(format!(
                    "{VAR_MECHANISM}={:?} is not one of {}",
                    var(VAR_MECHANISM).unwrap_or_default(),
                    MECHANISMS.join(", ")
                ));
            }
            let Some(username) = var(VAR_USERNAME) else {
                return err(format!(
                    "{VAR_USERNAME} is required with {VAR_PROTOCOL}={protocol}"
                ));
            };
            let password = match (var(VAR_PASSWORD), var(VAR_PASSWORD_FILE)) {
                (Some(_), Some(_)) => {
                    return err(format!(
                        "set {VAR_PASSWORD_FILE} or {VAR_PASSWORD}, not both"
                    ))
                }
                (Some(p), None) => p,
                (None, Some(file)) => read_secret(Path::new(&file))?,
                (None, None) => {
                    return err(format!(
                        "{VAR_PROTOCOL}={protocol} needs a password: set {VAR_PASSWORD_FILE} \
                         (a file holding it) or {VAR_PASSWORD}"
                    ))
                }
            };
            if password.is_empty() {
                return err("the Kafka SASL password is empty".into());
            }
            props.push(("sasl.mechanism", mechanism));
            props.push(("sasl.username", username.trim().to_string()));
            props.push(("sasl.password", password));
        } else if let Some(name) = SASL_VARS.iter().find(|n| var(n).is_some()) {
            return err(format!(
                "{name} is set but {VAR_PROTOCOL}={protocol} does not use SASL (use SASL_SSL)"
            ));
        }
        if protocol.ends_with("SSL") {
            for (name, key) in [
                (VAR_CA, "ssl.ca.location"),
                (VAR_CERT, "ssl.certificate.location"),
                (VAR_KEY, "ssl.key.location"),
            ] {
                if let Some(path) = var(name) {
                    if !PathBuf::from(&path).is_file() {
                        return err(format!("{name}={path}: no such file"));
                    }
                    props.push((key, path));
                }
            }
            if var(VAR_CERT).is_some() != var(VAR_KEY).is_some() {
                return err(format!(
                    "a client certificate needs both {VAR_CERT} and {VAR_KEY}"
                ));
            }
        } else if let Some(name) = SSL_VARS.iter().find(|n| var(n).is_some()) {
            return err(format!(
                "{name} is set but {VAR_PROTOCOL}={protocol} does not use TLS (use SSL or SASL_SSL)"
            ));
        }
        Ok(Self { props })
    }

    /// The librdkafka properties (`security.protocol`, `sasl.*`, `ssl.*`); empty = PLAINTEXT.
    pub fn properties(&self) -> &[(&'static str, String)] {
        &self.props
    }

    /// The protocol in use, for log lines (never the credentials).
    pub fn protocol(&self) -> &str {
        self.props
            .first()
            .map(|(_, v)| v.as_str())
            .unwrap_or("PLAINTEXT")
    }
}

fn read_secret(path: &Path) -> Result<String, KafkaSecurityError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.trim_end_matches(['\r', '\n']).to_string()),
        Err(e) => err(format!(
            "{VAR_PASSWORD_FILE}={}: cannot read it ({e})",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<KafkaSecurity, KafkaSecurityError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        KafkaSecurity::from_lookup(|name| map.get(name).cloned())
    }

    fn props(s: &KafkaSecurity) -> HashMap<&str, &str> {
        s.properties()
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect()
    }

    #[test]
    fn nothing_set_is_plaintext() {
        assert!(from(&[]).unwrap().properties().is_empty());
    }

    #[test]
    fn sasl_ssl_with_a_password_file_maps_to_librdkafka_properties() {
        let dir = std::env::temp_dir().join(format!("cgloop-ks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pw, ca) = (dir.join("pw"), dir.join("ca.pem"));
        std::fs::write(&pw, "s3cret\n").unwrap();
        std::fs::write(&ca, "pem").unwrap();
        let s = from(&[
            (VAR_PROTOCOL, "sasl_ssl"),
            (VAR_USERNAME, "cgloop"),
            (VAR_PASSWORD_FILE, pw.to_str().unwrap()),
            (VAR_CA, ca.to_str().unwrap()),
        ])
        .unwrap();
        let p = props(&s);
        assert_eq!(p["security.protocol"], "SASL_SSL");
        assert_eq!(p["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(p["sasl.username"], "cgloop");
        assert_eq!(p["sasl.password"], "s3cret");
        assert_eq!(p["ssl.ca.location"], ca.to_str().unwrap());
        assert!(
            !format!("{s:?}").contains("s3cret"),
            "Debug must not show the password"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_values_are_refused_naming_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(VAR_PROTOCOL, "SASL_TLS")], VAR_PROTOCOL),
            (
                &[(VAR_PROTOCOL, "SASL_SSL"), (VAR_PASSWORD, "x")],
                VAR_USERNAME,
            ),
            (
                &[(VAR_PROTOCOL, "SASL_SSL"), (VAR_USERNAME, "u")],
                VAR_PASSWORD_FILE,
            ),
            (
                &[
                    (VAR_PROTOCOL, "SASL_SSL"),
                    (VAR_USERNAME, "u"),
                    (VAR_PASSWORD, "x"),
                    (VAR_MECHANISM, "GSSAPI"),
                ],
                VAR_MECHANISM,
            ),
            (
                &[
                    (VAR_PROTOCOL, "SASL_SSL"),
                    (VAR_USERNAME, "u"),
                    (VAR_PASSWORD_FILE, "/nonexistent/pw"),
                ],
                VAR_PASSWORD_FILE,
            ),
            (&[(VAR_USERNAME, "u")], VAR_PROTOCOL),
            (
                &[(VAR_PROTOCOL, "PLAINTEXT"), (VAR_USERNAME, "u")],
                VAR_USERNAME,
            ),
            (
                &[
                    (VAR_PROTOCOL, "SASL_PLAINTEXT"),
                    (VAR_USERNAME, "u"),
                    (VAR_PASSWORD, "x"),
                    (VAR_CA, "/etc/hostname"),
                ],
                VAR_CA,
            ),
            (
                &[(VAR_PROTOCOL, "SSL"), (VAR_CA, "/nonexistent/ca.pem")],
                VAR_CA,
            ),
        ];
        for (vars, named) in cases {
            let e = from(vars).expect_err(&format!("{vars:?} must be refused"));
            assert!(e.0.contains(named), "{vars:?}: {e} does not name {named}");
        }
    }
}
