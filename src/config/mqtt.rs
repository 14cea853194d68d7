//! `[mqtt]`: the Sparkplug B edge node's configuration. Off unless `brokers` lists a URL.
//! Its keys are read and checked here (`read_keys`), called from `read.rs` with the
//! rest of the configuration, so `fieldgate check` reports their problems with the others.

use std::path::{Path, PathBuf};

use crate::toml_reader::Table;

/// `[mqtt]`.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttConfig {
    /// Broker URLs, `mqtt://host[:port]` or `mqtts://host[:port]`, tried in order (the
    /// next one when a broker cannot be reached or the primary host goes offline on it).
    /// Empty: no MQTT at all.
    pub brokers: Vec<String>,
    /// Certificate authorities (PEM) trusted for `mqtts://` brokers.
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) and its key, for brokers that ask for one.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// MQTT client ID; empty: `fieldgate-<edge_node_id>`.
    pub client_id: String,
    /// Names of the environment variables holding the user name and password; empty: none.
    pub username_env: String,
    pub password_env: String,
    /// Sparkplug group ID; empty: the plant of the devices.
    pub group_id: String,
    /// Sparkplug edge node ID; empty: the host name.
    pub edge_node_id: String,
    /// The primary host application whose STATE decides when data is sent; empty: none.
    pub primary_host_id: String,
    /// QoS of data messages: 0 as the specification says, or 1 (opt-in).
    pub data_qos: u8,
    /// MQTT keep-alive.
    pub keep_alive_s: u64,
    /// Longest wait between connection attempts (the backoff doubles up to it).
    pub reconnect_max_ms: u64,
    /// A metric whose value stays inside its deadband is still sent this often.
    pub max_silence_s: u64,
    /// Store-and-forward buffer: size cap and age cap; beyond either the oldest go.
    pub buffer_max_mb: u64,
    pub buffer_max_age_h: u64,
    /// After a message too large to take arrived on the command topics, how long NCMD/DCMD
    /// stay unsubscribed (so that a retained one cannot drop every connection).
    pub commands_pause_s: u64,
    /// After each connection's NBIRTH, data waits up to this long for the broker to deliver
    /// the NBIRTH back to the node (a broker's ACL drops a publish without telling the
    /// client); not delivered by then, the connection is tried again. 0: no such check.
    pub confirm_birth_s: u64,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            brokers: Vec::new(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            client_id: String::new(),
            username_env: String::new(),
            password_env: String::new(),
            group_id: String::new(),
            edge_node_id: String::new(),
            primary_host_id: String::new(),
            data_qos: 0,
            keep_alive_s: 30,
            reconnect_max_ms: 30_000,
            max_silence_s: 60,
            buffer_max_mb: 256,
            buffer_max_age_h: 168,
            commands_pause_s: 600,
            confirm_birth_s: 10,
        }
    }
}

impl MqttConfig {
    pub fn enabled(&self) -> bool {
        !self.brokers.is_empty()
    }

    /// Every key the default file sets, changed (its test restores them all from the file).
    #[cfg(test)]
    pub fn every_key_changed() -> MqttConfig {
        MqttConfig {
            client_id: "x".into(),
            group_id: "x".into(),
            edge_node_id: "x".into(),
            primary_host_id: "x".into(),
            data_qos: 1,
            keep_alive_s: 5,
            reconnect_max_ms: 100,
            max_silence_s: 1,
            buffer_max_mb: 1,
            buffer_max_age_h: 1,
            commands_pause_s: 1,
            confirm_birth_s: 1,
            ..Default::default()
        }
    }
}

/// Why a string cannot be a Sparkplug ID (group, edge node, device, host).
pub fn id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("must not be empty")
    } else if id.contains(['/', '+', '#']) {
        Some("must not contain '/', '+' or '#' (MQTT topic separators and wildcards)")
    } else if id.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else {
        None
    }
}

/// A broker to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

impl std::fmt::Display for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

/// `mqtt://host[:port]` (1883) or `mqtts://host[:port]` (8883), nothing else. The error
/// never quotes credentials.
pub fn parse_broker(s: &str) -> Result<Broker, String> {
    let url = url::Url::parse(s)
        .map_err(|e| format!("not a URL ({e}): write mqtt://host:1883 or mqtts://host:8883"))?;
    let tls = match url.scheme() {
        "mqtt" => false,
        "mqtts" => true,
        other => return Err(format!("scheme {other}:// is not mqtt:// or mqtts://")),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err("no credentials in the URL: use username_env and password_env".into());
    }
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Err("the URL has no host".into());
    };
    if !(url.path().is_empty() || url.path() == "/") || url.query().is_some() || url.fragment().is_some() {
        return Err("the URL must be only scheme, host and port".into());
    }
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    Ok(Broker { host, port: url.port().unwrap_or(if tls { 8883 } else { 1883 }), tls })
}

/// Reads `[mqtt]`'s keys from `s` into `m`, reporting each bad one on `s`.
pub fn read_keys(s: &Table<'_, '_>, m: &mut MqttConfig) {
    read_connection_keys(s, m);
    let id = |key: &'static str, slot: &mut String| {
        if let Some(v) = s.str(key) {
            match id_problem(v) {
                Some(why) if !v.is_empty() => s.problem(key, why),
                _ => *slot = v.to_string(),
            }
        }
    };
    id("group_id", &mut m.group_id);
    id("edge_node_id", &mut m.edge_node_id);
    id("primary_host_id", &mut m.primary_host_id);
    if let Some(q) = s.int("data_qos", 0..=1) {
        m.data_qos = q as u8;
    }
    let int = |key: &'static str, range, slot: &mut u64| {
        if let Some(v) = s.int(key, range) {
            *slot = v as u64;
        }
    };
    int("max_silence_s", 1..=86_400, &mut m.max_silence_s);
    int("buffer_max_mb", 1..=1_048_576, &mut m.buffer_max_mb);
    int("buffer_max_age_h", 1..=87_600, &mut m.buffer_max_age_h);
    int("commands_pause_s", 1..=86_400, &mut m.commands_pause_s);
    int("confirm_birth_s", 0..=600, &mut m.confirm_birth_s);
}

/// Reads the keys of a broker connection (URLs, TLS files, client ID, credentials,
/// keep-alive, reconnect backoff): `[mqtt]`'s, and `[hub]`'s, which are the same keys.
pub fn read_connection_keys(s: &Table<'_, '_>, m: &mut MqttConfig) {
    if let Some(list) = s.strings("brokers") {
        let bad: Vec<String> =
            list.iter().filter_map(|u| parse_broker(u).err().map(|why| format!("{u:?}: {why}"))).collect();
        if bad.is_empty() {
            m.brokers = list;
        } else {
            let redacted: Vec<String> = bad.into_iter().map(|b| redact(&b)).collect();
            s.problem("brokers", redacted.join("; "));
        }
    }
    let file = |key: &'static str, slot: &mut Option<PathBuf>, check: fn(&Path) -> Result<(), String>| {
        if let Some(v) = s.str(key) {
            if v.is_empty() {
                *slot = None;
            } else if let Err(why) = check(Path::new(v)) {
                s.problem(key, why);
                // Set all the same: the rules across keys ("ca_file is empty") do not fire too.
                *slot = Some(PathBuf::from(v));
            } else {
                *slot = Some(PathBuf::from(v));
            }
        }
    };
    file("ca_file", &mut m.ca_file, |p| super::security::pem_file(p, "CERTIFICATE"));
    file("client_cert_file", &mut m.client_cert_file, |p| super::security::pem_file(p, "CERTIFICATE"));
    file("client_key_file", &mut m.client_key_file, |p| super::security::pem_file(p, "PRIVATE KEY"));
    if let Some(v) = s.str("client_id") {
        m.client_id = v.to_string();
    }
    let env = |key: &'static str, slot: &mut String| {
        if let Some(v) = s.str(key) {
            match super::webhook::check_env_name(v) {
                Err(why) if !v.is_empty() => s.problem(key, why),
                _ => *slot = v.to_string(),
            }
        }
    };
    env("username_env", &mut m.username_env);
    env("password_env", &mut m.password_env);
    let int = |key: &'static str, range, slot: &mut u64| {
        if let Some(v) = s.int(key, range) {
            *slot = v as u64;
        }
    };
    int("keep_alive_s", 5..=3600, &mut m.keep_alive_s);
    int("reconnect_max_ms", 100..=600_000, &mut m.reconnect_max_ms);
}

/// Cross-key rules and the environment variables the keys name, of the connection keys
/// in section `section` (`mqtt` or `hub`).
pub fn problems(section: &str, m: &MqttConfig, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    if !m.enabled() {
        return out;
    }
    let tls = m.brokers.iter().any(|b| parse_broker(b).is_ok_and(|b| b.tls));
    if tls && m.ca_file.is_none() {
        out.push(format!("{section}.brokers has an mqtts:// URL but {section}.ca_file is empty: name the PEM file of the certificate authorities that signed the broker's certificate"));
    }
    if m.client_cert_file.is_some() != m.client_key_file.is_some() {
        out.push(format!(
            "{section}.client_cert_file and {section}.client_key_file go together: set both or neither"
        ));
    }
    for (key, name) in [("username_env", &m.username_env), ("password_env", &m.password_env)] {
        if !name.is_empty() && env(name).is_none() {
            out.push(format!("{section}.{key} names the environment variable {name}, which is not set"));
        }
    }
    if m.password_env.is_empty() != m.username_env.is_empty() && !m.password_env.is_empty() {
        out.push(format!(
            "{section}.password_env is set without {section}.username_env: MQTT sends a password only with a user name"
        ));
    }
    out
}

/// The variables `username_env` and `password_env` name (as the environment overrides
/// them), which are secrets and not configuration keys even when named `FIELDGATE_...`.
/// `section` is the configuration section in upper case (`MQTT`, `HUB`).
pub fn secret_vars(section: &str, m: &MqttConfig, env: &[&(String, String)]) -> [String; 2] {
    let var = |key: &str, file: &str| {
        let key = format!("FIELDGATE_{section}_{key}");
        env.iter().find(|(k, _)| *k == key).map_or_else(|| file.to_string(), |(_, v)| v.clone())
    };
    [var("USERNAME_ENV", &m.username_env), var("PASSWORD_ENV", &m.password_env)]
}

/// A broker problem with any `user:password@` removed.
fn redact(s: &str) -> String {
    match (s.find("://"), s.find('@')) {
        (Some(a), Some(b)) if b > a => format!("{}***{}", &s[..a + 3], &s[b..]),
        _ => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(id_problem("A"), None);
        for bad in ["", "a/b", "a+", "#", "a\nb"] {
            assert!(id_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn broker_urls() {
        assert_eq!(
            parse_broker("mqtt://127.0.0.1").unwrap(),
            Broker { host: "127.0.0.1".into(), port: 1883, tls: false }
        );
        assert_eq!(parse_broker("mqtts://b.example:9000").unwrap().to_string(), "mqtts://b.example:9000");
        assert_eq!(parse_broker("mqtt://[::1]:1884").unwrap().host, "::1");
        for bad in ["", "127.0.0.1:1883", "http://h", "mqtt://", "mqtt://h/x", "mqtt://h?q", "mqtt://u:p@h"] {
            assert!(parse_broker(bad).is_err(), "{bad}");
        }
        let e = parse_broker("mqtt://u:hunter2@h").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(redact("\"mqtt://u:hunter2@h\": x"), "\"mqtt://***@h\": x");
    }

    #[test]
    fn check_reports_every_mqtt_problem_and_never_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[mqtt]\nbrokers = [\"mqtt://u:hunter2@h\", \"tcp://h\"]\ngroup_id = \"a/b\"\ndata_qos = 2\nca_file = \"/nonexistent.pem\"\nusername_env = \"not a name\"\nbuffer_mb = 1\n",
        )
        .unwrap();
        let env = [
            ("FIELDGATE_MQTT_PASSWORD_ENV".to_string(), "FIELDGATE_MQTT_PW".to_string()),
            ("FIELDGATE_MQTT_PW".to_string(), "s3cret".to_string()),
        ];
        let e = crate::config::Config::load(Some(&path), env).unwrap_err();
        let text: Vec<String> = e.0.iter().map(|p| p.to_string()).collect();
        let all = text.join("\n");
        for want in [
            "brokers",
            "tcp://",
            "group_id",
            "data_qos",
            "ca_file",
            "username_env",
            "unknown key `buffer_mb`",
        ] {
            assert!(all.contains(want), "{want} in {all}");
        }
        assert!(!all.contains("hunter2") && !all.contains("s3cret"), "{all}");
        // The password's variable is not taken for a configuration key.
        assert!(!all.contains("FIELDGATE_MQTT_PW:"), "{all}");
        let ok = crate::config::Config::load(
            None,
            [("FIELDGATE_MQTT_BROKERS".into(), "[\"mqtt://127.0.0.1:1\"]".into())],
        );
        assert_eq!(ok.unwrap().mqtt.brokers, ["mqtt://127.0.0.1:1"]);
    }

    #[test]
    fn certificate_files_that_are_not_regular_files_are_refused_at_once_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ca.pem");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        for ca in [fifo.to_str().unwrap(), "/dev/zero", "/nonexistent.pem"] {
            let path = dir.path().join("c.toml");
            let text = format!("[mqtt]\nbrokers = [\"mqtts://h\"]\nca_file = \"{ca}\"\n");
            std::fs::write(&path, text).unwrap();
            // A FIFO would block here and /dev/zero fill the memory: both end at once.
            let e = crate::config::Config::load(Some(&path), Vec::<(String, String)>::new()).unwrap_err();
            let text: Vec<String> = e.0.iter().map(|p| p.to_string()).collect();
            assert_eq!(text.len(), 1, "one problem, not also \"ca_file is empty\": {text:?}");
            assert!(text[0].contains("ca_file") && text[0].contains(ca), "{text:?}");
        }
    }

    #[test]
    fn cross_key_problems() {
        let none = |_: &str| None;
        assert!(problems("mqtt", &MqttConfig::default(), none).is_empty());
        let mut m = MqttConfig { brokers: vec!["mqtts://h".into()], ..MqttConfig::default() };
        m.password_env = "PW".into();
        m.client_cert_file = Some("c.pem".into());
        let p = problems("mqtt", &m, none);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].contains("ca_file") && p[1].contains("client_key_file") && p[2].contains("PW"));
    }
}
