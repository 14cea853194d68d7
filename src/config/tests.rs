use super::*;

#[test]
fn default_file_equals_code_defaults() {
    // The embedded file is the documentation of every key; it must not drift.
    let cfg = Config::load(None, []).unwrap();
    assert_eq!(cfg, Config::default());
}

#[test]
fn default_file_sets_every_key() {
    // Change every default in code; applying the file must restore all of them.
    let mut c = Config::default();
    c.devices.dir = "x".into();
    c.server = ServerConfig {
        listen: "1.2.3.4:1".parse().unwrap(),
        request_timeout_ms: 1,
        header_timeout_ms: 1,
        max_body_bytes: 1,
        rate_limit_per_minute: 1,
        allowed_hosts: vec!["x".into()],
        allowed_origins: vec!["http://x".into()],
        shutdown_grace_ms: 1,
        mcp_max_sessions: 1,
        mcp_session_idle_s: 1,
        public_url: "x".into(),
        allow_plaintext: true,
        // No [server.tls] or [server.oauth] by default: their tables turn them on.
        tls: None,
        oauth: None,
    };
    c.auth.tokens_file = Some("x".into());
    c.storage = StorageConfig {
        data_dir: "x".into(),
        flush_interval_ms: 1,
        retention_days: 1,
        retention_max_mb: 1,
        reserve_mb: 1,
        reserve_percent: 1,
        unflushed_max_mb: 1,
    };
    c.calls = CallsConfig {
        deadline_ms: 1,
        max_retries: 9,
        retry_backoff_ms: 1,
        repeat_failure_limit: 1,
        repeat_failure_window_s: 1,
    };
    c.breaker = BreakerConfig {
        failure_threshold: 1,
        failure_rate_percent: 1,
        window_size: 1,
        min_calls: 1,
        open_ms: 1,
        max_open_ms: 1,
        report_down_after_s: 1,
    };
    c.history.max_silence_s = 1;
    c.work_orders.pending_ttl_hours = 1;
    c.work_orders.auto_approve = vec!["x".into()];
    c.work_orders.webhook_url = "x".into();
    c.work_orders.webhook_ca_file = Some("x".into());
    c.work_orders.webhook_auth_env = "X".into();
    c.work_orders.webhook_auth_header = "X".into();
    c.mqtt = super::mqtt::MqttConfig::every_key_changed();
    c.hub = super::hub::HubConfig::every_key_changed();
    assert!(apply_text(&mut c, "d", DEFAULT_TOML).is_empty());
    assert_eq!(c, Config::default());
}

#[test]
fn env_overrides_file() {
    let env = [
        ("FIELDGATE_SERVER_LISTEN".to_string(), "127.0.0.1:9999".to_string()),
        ("FIELDGATE_CALLS_DEADLINE_MS".to_string(), "3000".to_string()),
        ("FIELDGATE_LOG".to_string(), "debug".to_string()),
        ("FIELDGATE_CLI_TOKEN".to_string(), "abcdefghijklmnop1234".to_string()),
        ("PATH".to_string(), "/bin".to_string()),
    ];
    let cfg = Config::load(None, env).unwrap();
    assert_eq!(cfg.server.listen.port(), 9999);
    assert_eq!(cfg.calls.deadline_ms, 3000);
}

#[test]
fn reports_every_problem_with_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"localhost\"\nmax_body_bytes = \"big\"\n\n[breaker]\nopen_ms = 5\nfailur_threshold = 3\n[nope]\n",
    )
    .unwrap();
    let env = [
        ("FIELDGATE_CALLS_DEADLINE_MS".to_string(), "soon".to_string()),
        ("FIELDGATE_SEVER_LISTEN".to_string(), "x".to_string()),
    ];
    let err = Config::load(Some(&path), env).unwrap_err();
    let prefix = format!("{}/", dir.path().display());
    let text: Vec<String> = err.0.iter().map(|p| p.to_string().replace(&prefix, "")).collect();
    assert_eq!(
        text,
        [
            r#"bad.toml:2: `listen` in [server]: must be ip:port, e.g. "127.0.0.1:8080", found "localhost""#,
            "bad.toml:3: `max_body_bytes` in [server]: must be an integer, found a string",
            "bad.toml:6: `open_ms` in [breaker]: must be between 10 and 86400000, found 5",
            "bad.toml:7: unknown key `failur_threshold` in [breaker]; did you mean `failure_threshold`?",
            "bad.toml:8: unknown key `nope`",
            "environment variable FIELDGATE_CALLS_DEADLINE_MS: `deadline_ms` in [calls]: must be an integer, found a string",
            "environment variable FIELDGATE_SEVER_LISTEN: not a configuration key: the name must be \
             FIELDGATE_<SECTION>_<KEY> with SECTION one of DEVICES, SERVER, AUTH, STORAGE, CALLS, BREAKER, \
             HISTORY, WORK_ORDERS, ALARMS, MQTT, HUB",
        ]
    );
}

#[test]
fn mcp_session_keys_are_checked() {
    let env = [
        ("FIELDGATE_SERVER_MCP_MAX_SESSIONS".to_string(), "10000".to_string()),
        ("FIELDGATE_SERVER_MCP_SESSION_IDLE_S".to_string(), "60".to_string()),
    ];
    let cfg = Config::load(None, env).unwrap();
    assert_eq!((cfg.server.mcp_max_sessions, cfg.server.mcp_session_idle_s), (10_000, 60));
    let env = [
        ("FIELDGATE_SERVER_MCP_MAX_SESSIONS".to_string(), "0".to_string()),
        ("FIELDGATE_SERVER_MCP_SESSION_IDLE_S".to_string(), "forever".to_string()),
    ];
    let text: Vec<String> = Config::load(None, env).unwrap_err().0.iter().map(|p| p.to_string()).collect();
    assert_eq!(text.len(), 2, "{text:?}");
    assert!(text[0].contains("`mcp_max_sessions` in [server]: must be between 1 and 100000"), "{text:?}");
    assert!(text[1].contains("`mcp_session_idle_s` in [server]: must be an integer"), "{text:?}");
}

#[test]
fn cross_key_rules() {
    let env = [
        ("FIELDGATE_BREAKER_MIN_CALLS".to_string(), "30".to_string()),
        ("FIELDGATE_BREAKER_OPEN_MS".to_string(), "70000".to_string()),
    ];
    let err = Config::load(None, env).unwrap_err();
    let text: Vec<String> = err.0.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        [
            "configuration: breaker.min_calls (30) must not exceed breaker.window_size (20)",
            "configuration: breaker.open_ms (70000) must not exceed breaker.max_open_ms (60000)",
        ]
    );
    // Each rule alone, and its boundary: equal is allowed.
    let load = |pairs: &[(&str, &str)]| {
        Config::load(None, pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .map(|_| ())
            .map_err(|e| e.0.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(load(&[("FIELDGATE_BREAKER_MIN_CALLS", "20")]), Ok(()));
    assert_eq!(load(&[("FIELDGATE_BREAKER_OPEN_MS", "60000")]), Ok(()));
    assert_eq!(
        load(&[("FIELDGATE_BREAKER_WINDOW_SIZE", "5")]),
        Err(vec![
            "configuration: breaker.min_calls (10) must not exceed breaker.window_size (5)".to_string()
        ])
    );
    assert_eq!(
        load(&[("FIELDGATE_BREAKER_MAX_OPEN_MS", "100")]),
        Err(vec![
            "configuration: breaker.open_ms (5000) must not exceed breaker.max_open_ms (100)".to_string()
        ])
    );
}

#[test]
fn oauth_keys_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let oauth =
        "[server]\npublic_url = \"https://edge01.plant\"\n[server.oauth]\nissuer = \"https://idp.plant/\"\n";
    std::fs::write(&path, format!("{oauth}require_at_jwt = true\nleeway_s = 5\n")).unwrap();
    let cfg = Config::load(Some(&path), []).unwrap();
    let o = cfg.server.oauth.expect("the table turns it on");
    assert!(o.require_at_jwt);
    assert_eq!((o.leeway_s, o.issuer.as_str()), (5, "https://idp.plant/"));
    std::fs::write(&path, oauth).unwrap();
    assert!(!Config::load(Some(&path), []).unwrap().server.oauth.unwrap().require_at_jwt, "off by default");
    std::fs::write(&path, format!("{oauth}audiences = [\"https://edge01.plant/mcp\", \" \"]\n")).unwrap();
    let text: Vec<String> =
        Config::load(Some(&path), []).unwrap_err().0.iter().map(|p| p.to_string()).collect();
    assert!(text.len() == 1 && text[0].contains("must not hold an empty audience"), "{text:?}");
    // A bad issuer is one problem, not also "needs issuer".
    let bad_issuer = oauth.replace("https://idp.plant/", "http://idp.plant/");
    std::fs::write(&path, bad_issuer).unwrap();
    let text: Vec<String> =
        Config::load(Some(&path), []).unwrap_err().0.iter().map(|p| p.to_string()).collect();
    assert!(text.len() == 1 && text[0].contains("must be an https:// URL"), "{text:?}");
    std::fs::write(&path, format!("{oauth}require_at_jwt = \"yes\"\n")).unwrap();
    let text: Vec<String> =
        Config::load(Some(&path), []).unwrap_err().0.iter().map(|p| p.to_string()).collect();
    assert!(text.len() == 1 && text[0].contains("`require_at_jwt` in [server.oauth]"), "{text:?}");
}

#[test]
fn tls_keys_say_one_thing_per_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("cert.pem"), "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
    std::fs::write(p("key.pem"), "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n").unwrap();
    std::fs::write(p("junk"), "not pem").unwrap();
    let text = |toml: String| {
        std::fs::write(p("c.toml"), toml).unwrap();
        match Config::load(Some(&p("c.toml")), []) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        }
    };
    let tls = |cert: &str, url: &str| {
        format!(
            "[server]\npublic_url = \"{url}\"\n[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            p(cert).display(),
            p("key.pem").display()
        )
    };
    assert_eq!(text(tls("cert.pem", "https://edge01.plant")), Vec::<String>::new());
    // A file that is not PEM: that, and not also "needs cert_file and key_file".
    let t = text(tls("junk", "https://edge01.plant"));
    assert!(t.len() == 1 && t[0].contains("holds no PEM CERTIFICATE block"), "{t:?}");
    let t = text(tls("cert.pem", "http://edge01.plant"));
    assert!(t.len() == 1 && t[0].contains("public_url must start with https://"), "{t:?}");
}

/// `[hub]` takes `[mqtt]`'s connection keys with the same rules, its own keys, and none of
/// the edge node's; its problems name `hub.`, and the variables its credentials name are
/// secrets, not configuration keys.
#[test]
fn hub_section_shares_the_connection_keys_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.toml");
    std::fs::write(
        &path,
        "[hub]\nbrokers = [\"mqtts://b.plant\"]\ngroup_id = \"A\"\ngroups = [\"A\", \"B/C\", \"A\"]\nhost_id = \"\"\nreorder_timeout_ms = 5\nusername_env = \"FIELDGATE_HUB_USER\"\n",
    )
    .unwrap();
    let env = [("FIELDGATE_HUB_USER".to_string(), "secret-name".to_string())];
    let err = Config::load(Some(&path), env).unwrap_err();
    let text: Vec<String> = err.0.iter().map(|p| p.message.clone()).collect();
    let has = |part: &str| text.iter().any(|t| t.contains(part));
    assert!(has("unknown key `group_id` in [hub]"), "{text:?}");
    assert!(has("`groups` in [hub]: \"B/C\""), "{text:?}");
    assert!(has("\"A\" is named twice"), "{text:?}");
    assert!(has("`host_id` in [hub]: must not be empty"), "{text:?}");
    assert!(has("`reorder_timeout_ms` in [hub]: must be between 10"), "{text:?}");
    assert!(has("hub.brokers has an mqtts:// URL but hub.ca_file is empty"), "{text:?}");
    assert!(
        !text.iter().any(|t| t.contains("FIELDGATE_HUB_USER") && t.contains("not a configuration key")),
        "{text:?}"
    );
    assert!(!text.iter().any(|t| t.contains("secret-name")), "{text:?}");

    std::fs::write(
        &path,
        "[hub]\nbrokers = [\"mqtt://b.plant:1884\"]\ngroups = [\"A\"]\nhost_id = \"scada-1\"\n",
    )
    .unwrap();
    let cfg = Config::load(Some(&path), []).unwrap();
    assert_eq!(
        (cfg.hub.link.brokers.len(), cfg.hub.groups.as_slice(), cfg.hub.host_id.as_str()),
        (1, &["A".to_string()][..], "scada-1")
    );
    assert!(!cfg.mqtt.enabled(), "the hub's brokers are not the edge node's");
}

#[test]
fn a_postgres_history_needs_its_url_variable_which_is_no_key() {
    let load = |pairs: &[(&str, &str)]| {
        Config::load(None, pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .map_err(|e| e.0.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(load(&[]).unwrap().history.backend, HistoryBackend::Redb, "redb by default");
    let no_url = load(&[("FIELDGATE_HISTORY_BACKEND", "postgres")]).unwrap_err();
    assert!(no_url.iter().any(|p| p.contains("FIELDGATE_PG_URL") && p.contains("not set")), "{no_url:?}");
    // The variable holds a secret: set, it is read as no configuration key.
    let secret = "postgres://fieldgate:hunter2@db/fieldgate";
    let c = load(&[("FIELDGATE_HISTORY_BACKEND", "postgres"), ("FIELDGATE_PG_URL", secret)]).unwrap();
    assert_eq!(c.history.backend, HistoryBackend::Postgres);
    let named = load(&[
        ("FIELDGATE_HISTORY_BACKEND", "postgres"),
        ("FIELDGATE_HISTORY_POSTGRES_URL_ENV", "FIELDGATE_HISTORIAN"),
        ("FIELDGATE_HISTORIAN", secret),
    ])
    .unwrap();
    assert_eq!(named.history.postgres_url_env, "FIELDGATE_HISTORIAN");
    // A URL that does not read is said at load (as `fieldgate check`), without the URL.
    let unread = load(&[
        ("FIELDGATE_HISTORY_BACKEND", "postgres"),
        ("FIELDGATE_PG_URL", "postgres://fieldgate:hunter2@127.0.0.1:notaport/db"),
    ])
    .unwrap_err();
    assert!(unread.iter().any(|p| p.contains("holds no PostgreSQL URL")), "{unread:?}");
    assert!(unread.iter().all(|p| !p.contains("hunter2")), "{unread:?}");
    let bad = load(&[("FIELDGATE_HISTORY_BACKEND", "mysql"), ("FIELDGATE_HISTORY_POSTGRES_URL_ENV", secret)]);
    let bad = bad.unwrap_err();
    assert!(bad.iter().any(|p| p.contains("backend") && p.contains("mysql")), "{bad:?}");
    assert!(bad.iter().any(|p| p.contains("postgres_url_env")), "{bad:?}");
    assert!(bad.iter().all(|p| !p.contains("hunter2")), "never the secret: {bad:?}");
}
