//! The `CGLOOP_*` variables cgloop reads, declared once in `core/src/cgloop/known_settings.toml`
//! (the table the `cgloop` command checks too, `cgloop.settings_known`): a Rust daemon refuses
//! at start a `CGLOOP_*` variable that is not there, naming it, so a misspelt setting is never
//! silently ignored.
use std::collections::BTreeSet;

/// The declaration, built into the binary.
const DECLARATION: &str = include_str!("../../../core/src/cgloop/known_settings.toml");
const PREFIX: &str = "CGLOOP_";

/// Every declared variable name.
pub fn known_settings() -> BTreeSet<String> {
    let table: toml::Table =
        toml::from_str(DECLARATION).expect("known_settings.toml is checked by the Python tests");
    table.keys().cloned().collect()
}

/// The declared name closest to `name`: one it is the start of, else the most similar one.
fn suggestion(name: &str, known: &BTreeSet<String>) -> Option<String> {
    if let Some(longer) = known
        .iter()
        .filter(|k| k.starts_with(name))
        .min_by_key(|k| k.len())
    {
        return Some(longer.clone());
    }
    known
        .iter()
        .map(|k| (strsim::normalized_levenshtein(name, k), k))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.clone())
}

/// One line naming every undeclared `CGLOOP_*` name among `names`, or None.
pub fn refusal<I: IntoIterator<Item = String>>(names: I) -> Option<String> {
    let known = known_settings();
    let unknown: BTreeSet<String> = names
        .into_iter()
        .filter(|n| n.starts_with(PREFIX) && !known.contains(n))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let parts: Vec<String> = unknown
        .iter()
        .map(|n| match suggestion(n, &known) {
            Some(near) => format!("{n} (did you mean {near}?)"),
            None => n.clone(),
        })
        .collect();
    let noun = if unknown.len() == 1 {
        "setting"
    } else {
        "settings"
    };
    Some(format!(
        "unknown {noun} in the environment: {}; cgloop reads only the CGLOOP_* variables \
         declared in core/src/cgloop/known_settings.toml",
        parts.join("; ")
    ))
}

/// At start, before the arguments are parsed: exit 2 with one line on stderr if the environment
/// holds a `CGLOOP_*` variable cgloop does not read.
pub fn refuse_unknown_settings(program: &str) {
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    if let Some(line) = refusal(names) {
        eprintln!("{program}: {line}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_holds_what_the_rust_daemons_read() {
        let known = known_settings();
        for name in [
            "CGLOOP_LOG_FORMAT",
            "CGLOOP_KAFKA_SECURITY_PROTOCOL",
            "CGLOOP_PROBE_METRICS_ADDR",
        ] {
            assert!(known.contains(name), "{name}");
        }
    }

    #[test]
    fn an_unknown_setting_is_named_with_the_close_one() {
        let line = refusal(["CGLOOP_KAFKA_BOOTSRAP".into(), "PATH".into()]).unwrap();
        assert!(
            line.contains("CGLOOP_KAFKA_BOOTSRAP (did you mean CGLOOP_KAFKA_BOOTSTRAP?)"),
            "{line}"
        );
        let line = refusal(["CGLOOP_ONOS_USER".into()]).unwrap();
        assert!(
            line.contains("did you mean CGLOOP_ONOS_USERNAME?"),
            "{line}"
        );
        assert_eq!(refusal(["CGLOOP_LOG_FORMAT".into(), "HOME".into()]), None);
    }
}
