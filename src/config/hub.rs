//! `[hub]`: the fleet hub, a Sparkplug B host application (`fieldgate hub`). Its broker
//! keys are `[mqtt]`'s, read by the same code (`mqtt::read_connection_keys`), so the same
//! URL rules, TLS files and credential variables apply.

use crate::toml_reader::Table;

use super::mqtt::{self, MqttConfig};

/// `[hub]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HubConfig {
    /// The broker connection: `brokers`, `ca_file`, `client_cert_file`, `client_key_file`,
    /// `client_id`, `username_env`, `password_env`, `keep_alive_s`, `reconnect_max_ms`
    /// (the edge node's own keys of `MqttConfig` are not read here).
    pub link: MqttConfig,
    /// The host application's ID: its STATE topic is `spBv1.0/STATE/<host_id>`.
    pub host_id: String,
    /// The Sparkplug groups this hub serves; empty: every group.
    pub groups: Vec<String>,
    /// A `seq` gap waits this long for the missing message, then the edge node is asked
    /// for a rebirth.
    pub reorder_timeout_ms: u64,
    /// At most one rebirth request per edge node this often.
    pub rebirth_cooldown_ms: u64,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            link: MqttConfig::default(),
            host_id: "fieldgate-hub".into(),
            groups: Vec::new(),
            reorder_timeout_ms: 2000,
            rebirth_cooldown_ms: 5000,
        }
    }
}

impl HubConfig {
    /// Every key the default file sets, changed (its test restores them all from the file).
    #[cfg(test)]
    pub fn every_key_changed() -> HubConfig {
        HubConfig {
            link: MqttConfig {
                client_id: "x".into(),
                keep_alive_s: 5,
                reconnect_max_ms: 100,
                ..Default::default()
            },
            host_id: "x".into(),
            groups: vec!["x".into()],
            reorder_timeout_ms: 1,
            rebirth_cooldown_ms: 1,
        }
    }
}

/// What keeps `fieldgate hub` from starting with `h` that a file alone cannot say is wrong
/// (an edge's configuration leaves `[hub]` empty).
pub fn start_problem(h: &HubConfig) -> Option<&'static str> {
    h.link.brokers.is_empty().then_some("hub.brokers is empty: name at least one broker (mqtt://host:port)")
}

/// Reads `[hub]`'s keys from `s` into `h`, reporting each bad one on `s`.
pub fn read_keys(s: &Table<'_, '_>, h: &mut HubConfig) {
    mqtt::read_connection_keys(s, &mut h.link);
    if let Some(v) = s.str("host_id") {
        match mqtt::id_problem(v) {
            Some(why) => s.problem("host_id", why),
            None => h.host_id = v.to_string(),
        }
    }
    if let Some(list) = s.strings("groups") {
        let mut bad: Vec<String> =
            list.iter().filter_map(|g| mqtt::id_problem(g).map(|why| format!("{g:?}: {why}"))).collect();
        let mut seen = std::collections::HashSet::new();
        bad.extend(list.iter().filter(|g| !seen.insert(g.as_str())).map(|g| format!("{g:?} is named twice")));
        if bad.is_empty() {
            h.groups = list;
        } else {
            s.problem("groups", bad.join("; "));
        }
    }
    if let Some(v) = s.int("reorder_timeout_ms", 10..=600_000) {
        h.reorder_timeout_ms = v as u64;
    }
    if let Some(v) = s.int("rebirth_cooldown_ms", 100..=3_600_000) {
        h.rebirth_cooldown_ms = v as u64;
    }
}
