//! The configuration's tests: parsing, every bound named, the docs in step.

use std::path::PathBuf;
use std::time::Duration;

use super::*;

struct MapEnv(&'static [(&'static str, &'static str)]);
impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

/// Keys that default to unset, so serializing the defaults omits them.
const OPTIONAL_KEYS: &[&str] = &[
    "auth.jwt_secret",
    "auth.audience",
    "auth.issuer",
    "auth.algorithms",
    "auth.jwks_url",
    "auth.jwks_file",
    "auth.cookie",
    "auth.public_origin",
    "gateway.runtime_dir",
    "gateway.sale_page_path",
    "backend.consumer_name",
    "limits.buy.user",
    "limits.buy.ip",
    "limits.buy.global",
    "limits.read.user",
    "limits.read.ip",
    "limits.read.global",
    "limits.cluster_global",
    "redis.master_name",
    "gateway.tls.cert_file",
    "gateway.tls.key_file",
    "events.webhook_url",
    "events.amqp_url",
    "events.ca_file",
    "redis.ca_file",
    "gateway.tls.redirect_port",
    "shop.ca_file",
    "shop.health_check_path",
];

/// `(key, default)` of every key row of docs/CONFIG.md's tables:
/// `section.key`, and `sales[].key` for the sales table.
fn reference_rows() -> Vec<(String, String)> {
    include_str!("../../../docs/CONFIG.md")
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let default = cells.get(2)?.trim_matches('`');
            key.contains('.')
                .then(|| (key.to_owned(), default.to_owned()))
        })
        .collect()
}

/// Every key `config/flashgate.toml` shows, set or commented out, in the
/// notation of docs/CONFIG.md (`section.key`; `array[].key` in a `[[array]]`
/// table), and the name of every table it shows.
fn shipped_keys() -> Vec<String> {
    let mut keys = Vec::new();
    let mut table = String::new();
    for line in include_str!("../../../config/flashgate.toml").lines() {
        let line = line.trim_start_matches(|c: char| c == '#' || c.is_whitespace());
        if let Some(name) = line
            .strip_prefix("[[")
            .and_then(|l| l.split_once("]]"))
            .map(|(n, _)| n)
        {
            keys.push(name.to_owned());
            table = format!("{name}[]");
        } else if let Some(name) = line
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
            .map(|(n, _)| n)
        {
            keys.push(name.to_owned());
            table = name.to_owned();
        } else if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                keys.push(if table.is_empty() {
                    key.to_owned()
                } else {
                    format!("{table}.{key}")
                });
            }
        }
    }
    keys
}

/// Whether the file parser takes `key` (in the notation of
/// [`shipped_keys`]): set to a value of the wrong type, it must be refused
/// for its type, not as an unknown field.
fn parser_takes(key: &str) -> bool {
    let doc = match key.rsplit_once('.') {
        Some((table, field)) => match table.strip_suffix("[]") {
            Some(array) => format!("[[{array}]]\n{field} = 0\n"),
            None => format!("[{table}]\n{field} = 0\n"),
        },
        None => format!("{key} = 0\n"),
    };
    match toml::from_str::<file::File>(&doc) {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown field"),
    }
}

#[test]
fn every_key_of_the_config_reference_is_shown_in_the_shipped_file_and_taken_by_the_parser() {
    let shipped = shipped_keys();
    let missing: Vec<String> = reference_rows()
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| !shipped.iter().any(|k| k == key))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/CONFIG.md keys missing from config/flashgate.toml (add them, commented out with their default): {missing:?}"
    );

    assert!(
        !parser_takes("gateway.thredas") && !parser_takes("sales[].stok"),
        "a misspelled key must be refused"
    );
    let unknown: Vec<String> = reference_rows()
        .into_iter()
        .map(|(key, _)| key)
        .chain(shipped)
        .filter(|key| !parser_takes(key))
        .collect();
    assert!(
        unknown.is_empty(),
        "keys in docs/CONFIG.md or config/flashgate.toml that the config refuses: {unknown:?}"
    );
}

#[test]
fn the_config_reference_lists_every_key_with_its_default() {
    let rows: Vec<(String, String)> = reference_rows()
        .into_iter()
        .filter(|(key, _)| !key.starts_with("sales"))
        .collect();
    let defaults = documented_defaults();
    for (key, default) in &defaults {
        let row = rows.iter().find(|(k, _)| k == key);
        assert_eq!(
            row.map(|(_, d)| d.as_str()),
            Some(default.as_str()),
            "docs/CONFIG.md: `{key}` missing or its default is not {default}"
        );
    }
    for (key, default) in &rows {
        let known = defaults.iter().any(|(k, _)| k == key)
            || (OPTIONAL_KEYS.contains(&key.as_str()) && default == "(unset)");
        assert!(known, "docs/CONFIG.md lists `{key}`, which the config does not take (or an optional key not marked (unset))");
    }
    for key in OPTIONAL_KEYS {
        assert!(
            rows.iter().any(|(k, _)| k == key),
            "docs/CONFIG.md: optional `{key}` missing"
        );
    }
}

#[test]
fn shipped_config_is_valid() {
    let text = include_str!("../../../config/flashgate.toml");
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert!(!c.sales.is_empty());
    assert!(
        c.jwt_secret.is_none(),
        "the shipped file must not carry a secret"
    );
}

#[test]
fn unknown_key_is_rejected_with_its_name_and_line() {
    let err =
        Config::from_toml_str("[gateway]\nthreads = 2\nthredas = 4\n", &NoEnv, 0).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("thredas"), "{msg}");
    assert!(msg.contains("line 3"), "{msg}");
}

#[test]
fn every_bad_value_is_reported_with_its_key() {
    let text = "[redis]\ntimeout_ms = 0\n[gateway]\nlisten = \"nope\"\n[[sales]]\nid = \"a b\"\nname = \"x\"\nstock = 1\n";
    let msg = Config::from_toml_str(text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for key in ["redis.timeout_ms", "gateway.listen", "sales[0].id"] {
        assert!(msg.contains(key), "{key} missing from {msg}");
    }
}

#[test]
fn secrets_come_from_the_environment_over_the_file() {
    let text = "[auth]\njwt_secret = \"file-secret-file-secret-file-secret\"\n";
    let env = MapEnv(&[
        ("FLASHGATE_JWT_SECRET", ENV_SECRET),
        ("FLASHGATE_ADMIN_TOKEN", ADMIN_SECRET),
    ]);
    let c = Config::from_toml_str(text, &env, 0).unwrap();
    assert_eq!(c.jwt_secret.as_deref(), Some(ENV_SECRET));
    assert_eq!(c.admin_token.as_deref(), Some(ADMIN_SECRET));
}

const ENV_SECRET: &str = "env-secret-env-secret-env-secret-env";
const ADMIN_SECRET: &str = "admin-token-admin-token-admin-token";

#[test]
fn secrets_under_32_bytes_are_refused_naming_where_they_came_from() {
    let short = MapEnv(&[
        ("FLASHGATE_JWT_SECRET", "replace-me"),
        ("FLASHGATE_ADMIN_TOKEN", "replace-me"),
    ]);
    let msg = Config::from_toml_str("", &short, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("FLASHGATE_JWT_SECRET: must be at least 32 bytes"),
        "{msg}"
    );
    assert!(
        msg.contains("FLASHGATE_ADMIN_TOKEN: must be at least 32 bytes"),
        "{msg}"
    );
    let msg = Config::from_toml_str("[auth]\njwt_secret = \"short\"\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("auth.jwt_secret: must be at least 32 bytes"),
        "{msg}"
    );
    let exactly = "x".repeat(MIN_SECRET_BYTES);
    let c =
        Config::from_toml_str(&format!("[auth]\njwt_secret = \"{exactly}\"\n"), &NoEnv, 0).unwrap();
    assert_eq!(c.jwt_secret.as_deref(), Some(exactly.as_str()));
}

#[test]
fn every_numeric_key_is_bounded_and_named() {
    let cases = [
        (
            "[gateway]\nidempotency_ttl_seconds = 604801\n",
            "gateway.idempotency_ttl_seconds",
        ),
        (
            "[gateway]\nidempotency_ttl_seconds = 18446744073709551615\n",
            "gateway.idempotency_ttl_seconds",
        ),
        (
            "[gateway]\nbacklog_pause_threshold = 1000000001\n",
            "gateway.backlog_pause_threshold",
        ),
        ("[gateway]\nruntime_dir = \"\"\n", "gateway.runtime_dir"),
        ("[limits]\nidle_seconds = 86401\n", "limits.idle_seconds"),
        (
            "[limits]\nidle_seconds = 31536000000\n",
            "limits.idle_seconds",
        ),
        (
            "[limits]\nmax_tracked_keys = 100000001\n",
            "limits.max_tracked_keys",
        ),
        (
            "[limits.buy]\nuser = { per_second = 1000001, burst = 1 }\n",
            "limits.buy.user.per_second",
        ),
        (
            "[limits.read]\nglobal = { per_second = 1, burst = 10000001 }\n",
            "limits.read.global.burst",
        ),
        (
            "[limits]\ncluster_global = { per_second = 4294967295, burst = 1 }\n",
            "limits.cluster_global.per_second",
        ),
        (
            "[backend]\nclaim_idle_ms = 86400001\n",
            "backend.claim_idle_ms",
        ),
        ("[auth]\naudience = \"\"\n", "auth.audience"),
        (
            "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 1\nduration_seconds = 31536001\n",
            "sales[0].duration_seconds",
        ),
    ];
    for (text, key) in cases {
        let msg = Config::from_toml_str(text, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(key), "{key} missing from {msg}");
    }
    let top = "[gateway]\nidempotency_ttl_seconds = 604800\n[limits]\nidle_seconds = 86400\n";
    let c = Config::from_toml_str(top, &NoEnv, 0).unwrap();
    assert_eq!(
        (c.gateway.idempotency_ttl.as_secs(), c.limits.idle.as_secs()),
        (604_800, 86_400)
    );
}

#[test]
fn the_client_ip_header_is_one_setting_x_forwarded_for_by_default() {
    assert_eq!(
        Config::from_toml_str("", &NoEnv, 0)
            .unwrap()
            .limits
            .client_ip_header,
        ClientIpHeader::XForwardedFor
    );
    let c =
        Config::from_toml_str("[limits]\nclient_ip_header = \"forwarded\"\n", &NoEnv, 0).unwrap();
    assert_eq!(c.limits.client_ip_header, ClientIpHeader::Forwarded);
    let msg = Config::from_toml_str("[limits]\nclient_ip_header = \"x-real-ip\"\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("client_ip_header"), "{msg}");
}

#[test]
fn an_ipv6_entry_that_would_hold_ipv4_clients_is_refused_naming_the_key() {
    for (key, section) in [
        ("deny.ips", "[deny]\nips"),
        ("limits.trusted_proxies", "[limits]\ntrusted_proxies"),
    ] {
        for net in ["::/0", "::ffff:0:0/80", "::ffff:0:0/95"] {
            let text = format!("{section} = [\"2001:db8::/32\", \"{net}\"]\n");
            let msg = Config::from_toml_str(&text, &NoEnv, 0)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("{key}[1]")) && msg.contains("IPv4"),
                "{msg}"
            );
        }
    }
    // Narrower IPv6 networks, and the mapped range itself, are fine.
    let c = Config::from_toml_str(
        "[deny]\nips = [\"2001:db8::/32\", \"::ffff:0:0/96\", \"64:ff9b::/96\"]\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert!(c.deny.denies_ip("203.0.113.1".parse().unwrap()));
    assert!(c.deny.denies_ip("2001:db8::1".parse().unwrap()));
}

#[test]
fn ipv4_mapped_addresses_match_ipv4_deny_entries_and_back() {
    let c = Config::from_toml_str(
        "[deny]\nips = [\"192.0.2.0/24\", \"::ffff:198.51.100.0/120\"]\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert!(c.deny.denies_ip("::ffff:192.0.2.9".parse().unwrap()));
    assert!(c.deny.denies_ip("198.51.100.9".parse().unwrap()));
    assert!(!c.deny.denies_ip("::ffff:203.0.113.1".parse().unwrap()));
}

#[test]
fn the_runtime_dir_comes_from_the_setting_then_systemd_then_xdg() {
    let dir = |text: &str, env: &dyn Env| {
        Config::from_toml_str(text, env, 0)
            .unwrap()
            .gateway
            .runtime_dir
    };
    let systemd = MapEnv(&[
        ("RUNTIME_DIRECTORY", "/run/flashgate:/run/other"),
        ("XDG_RUNTIME_DIR", "/run/user/1000"),
    ]);
    assert_eq!(
        dir("[gateway]\nruntime_dir = \"/srv/fg/run\"\n", &systemd),
        PathBuf::from("/srv/fg/run")
    );
    assert_eq!(dir("", &systemd), PathBuf::from("/run/flashgate"));
    assert_eq!(
        dir("", &MapEnv(&[("XDG_RUNTIME_DIR", "/run/user/1000")])),
        PathBuf::from("/run/user/1000/flashgate")
    );
    assert_eq!(dir("", &NoEnv), PathBuf::from("data/run"));
}

#[test]
fn audience_and_issuer_are_optional_claims() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(c.auth, AuthConfig::default());
    let c = Config::from_toml_str(
        "[auth]\naudience = \"shop\"\nissuer = \"https://shop.example\"\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(c.auth.audience.as_deref(), Some("shop"));
    assert_eq!(c.auth.issuer.as_deref(), Some("https://shop.example"));
}

#[test]
fn limits_and_deny_lists_are_parsed_and_checked() {
    let text = "[limits]\ntrusted_proxies = [\"10.0.0.0/8\"]\n[limits.buy]\nuser = { per_second = 2, burst = 5 }\n[deny]\nips = [\"192.0.2.7\", \"198.51.100.0/24\"]\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert_eq!(c.limits.buy.user, Bucket::new(2, 5));
    assert!(c.limits.buy.ip.is_none());
    assert!(c.deny.denies_ip("198.51.100.9".parse().unwrap()));
    assert!(c.deny.denies_ip("192.0.2.7".parse().unwrap()));
    assert!(!c.deny.denies_ip("192.0.2.8".parse().unwrap()));
    let bad = "[limits]\ntrusted_proxies = [\"nope\"]\n[limits.read]\nip = { per_second = 0, burst = 1 }\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("limits.trusted_proxies[0]") && msg.contains("limits.read.ip"),
        "{msg}"
    );
}

#[test]
fn shop_upstreams_and_page_caching_default_and_are_checked() {
    let c = Config::from_toml_str("[gateway]\nshop_upstream = \"127.0.0.1:8000\"\n", &NoEnv, 0)
        .unwrap();
    assert_eq!(
        c.shop.upstreams,
        vec![Origin::parse("127.0.0.1:8000").unwrap()]
    );
    assert_eq!(c.shop.resolve_interval, Duration::from_secs(5));
    assert_eq!(c.shop.host_header, HostHeader::Client);
    assert_eq!(
        (c.shop.ca_file.as_ref(), c.shop.health_check_path.as_ref()),
        (None, None)
    );
    assert_eq!(c.pages.state_ttl, Duration::from_millis(250));
    assert_eq!(
        c.pages.fingerprinted_max_age,
        Duration::from_secs(31_536_000)
    );
    let text =
        "[shop]\nupstreams = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n[pages]\nstate_ttl_ms = 100\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert_eq!(c.shop.upstreams.len(), 2);
    assert_eq!(c.pages.state_ttl, Duration::from_millis(100));
    let bad = "[shop]\nupstreams = [\"nope\"]\nconnect_timeout_ms = 0\n[pages]\nstate_ttl_ms = 0\npage_max_age_seconds = 99999999\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for key in [
        "shop.upstreams[0]",
        "shop.connect_timeout_ms",
        "pages.state_ttl_ms",
        "pages.page_max_age_seconds",
    ] {
        assert!(msg.contains(key), "{key} missing from {msg}");
    }
}

#[test]
fn shop_origins_take_names_schemes_and_their_keys() {
    let text = "[gateway]\nshop_upstream = \"not used:1\"\n[shop]\n\
        upstreams = [\"https://shop.example\", \"http://origin.internal:8080\", \"10.0.0.5:81\"]\n\
        resolve_interval_ms = 250\nca_file = \"/etc/ca.pem\"\nhost_header = \"www.shop.example\"\n\
        health_check_path = \"/healthz\"\n";
    let msg = Config::from_toml_str(text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("gateway.shop_upstream"), "{msg}");
    let c = Config::from_toml_str(&text.replace("not used:1", "127.0.0.1:1"), &NoEnv, 0).unwrap();
    let shown: Vec<String> = c.shop.upstreams.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "https://shop.example:443",
            "http://origin.internal:8080",
            "http://10.0.0.5:81"
        ]
    );
    assert_eq!(c.shop.resolve_interval, Duration::from_millis(250));
    assert_eq!(c.shop.ca_file, Some(PathBuf::from("/etc/ca.pem")));
    assert_eq!(
        c.shop.host_header,
        HostHeader::Fixed("www.shop.example".into())
    );
    assert_eq!(c.shop.health_check_path.as_deref(), Some("/healthz"));

    let bad = "[shop]\nupstreams = [\"https://10.0.0.5\", \"ftp://x\", \"shop.example\"]\n\
        resolve_interval_ms = 0\nhost_header = \"bad host\"\nhealth_check_path = \"healthz\"\nca_file = \"\"\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for want in [
        "shop.upstreams[0]: `https://10.0.0.5`: an https:// origin needs a host name",
        "shop.upstreams[1]: `ftp://x`: only http:// and https://",
        "shop.upstreams[2]: `shop.example` needs a port",
        "shop.resolve_interval_ms: must be between 100 and 3600000",
        "shop.host_header: must be \"client\" or a host name",
        "shop.health_check_path: must be a path starting with /",
        "shop.ca_file: must name a PEM file",
    ] {
        assert!(msg.contains(want), "{want} missing from {msg}");
    }
}

#[test]
fn the_path_prefix_defaults_to_flashgate_and_bad_mounts_are_named() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(c.gateway.path_prefix, "/flashgate");
    assert_eq!(c.gateway.sale_page_path, None);
    let text = "[gateway]\npath_prefix = \"/edge/sale\"\nsale_page_path = \"/drops/{id}\"\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert_eq!(c.gateway.path_prefix, "/edge/sale");
    assert_eq!(c.gateway.sale_page_path.as_deref(), Some("/drops/"));
    for (text, key, says) in [
        (
            "path_prefix = \"flashgate\"",
            "gateway.path_prefix",
            "got \"flashgate\"",
        ),
        (
            "path_prefix = \"/\"",
            "gateway.path_prefix",
            "plain path segments",
        ),
        (
            "path_prefix = \"/fg/\"",
            "gateway.path_prefix",
            "no trailing",
        ),
        (
            "path_prefix = \"/a/../b\"",
            "gateway.path_prefix",
            "plain path segments",
        ),
        (
            "sale_page_path = \"/drops\"",
            "gateway.sale_page_path",
            "ending in `/{id}`",
        ),
        (
            "sale_page_path = \"/drops/{id}/x\"",
            "gateway.sale_page_path",
            "ending in `/{id}`",
        ),
        (
            "sale_page_path = \"/flashgate/x/{id}\"",
            "gateway.sale_page_path",
            "outside",
        ),
    ] {
        let msg = Config::from_toml_str(&format!("[gateway]\n{text}\n"), &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(key) && msg.contains(says), "{text}: {msg}");
    }
}

#[test]
fn sale_window_defaults_to_now_plus_duration() {
    let text = "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\nduration_seconds = 10\n";
    let c = Config::from_toml_str(text, &NoEnv, 1000).unwrap();
    assert_eq!(
        (c.sales[0].starts_at_ms, c.sales[0].ends_at_ms),
        (1000, 11_000)
    );
    assert_eq!(c.sales[0].per_user_limit, 1);
}

#[test]
fn payment_timeout_and_recovery_keys_default_and_are_checked() {
    let text =
        "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\n[[sales]]\nid = \"t\"\nname = \"y\"\nstock = 5\npayment_timeout_seconds = 30\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert_eq!(c.payment_timeouts["s"], Duration::from_secs(900));
    assert_eq!(c.payment_timeouts["t"], Duration::from_secs(30));
    assert_eq!(c.backend.max_deliveries, 5);
    assert_eq!(c.backend.reconcile_interval, Duration::from_secs(60));
    let bad = "[backend]\nmax_deliveries = 0\nexpiry_poll_ms = 0\nrestore_poll_ms = 0\nreconcile_interval_ms = 0\n[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\npayment_timeout_seconds = 0\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for key in [
        "backend.max_deliveries",
        "backend.expiry_poll_ms",
        "backend.restore_poll_ms",
        "backend.reconcile_interval_ms",
        "sales[0].payment_timeout_seconds",
    ] {
        assert!(msg.contains(key), "{key} missing from {msg}");
    }
}

#[test]
fn every_problem_is_reported_with_its_key_its_bound_and_the_value() {
    let text = "[redis]\ntimeout_ms = 0\n[limits.buy]\nuser = { per_second = 0, burst = 0 }\n[pages]\nreload_interval_ms = 3600001\n";
    let Err(ConfigError::Invalid(problems)) = Config::from_toml_str(text, &NoEnv, 0) else {
        panic!("accepted")
    };
    for expected in [
        "redis.timeout_ms: must be between 1 and 60000, got 0",
        "limits.buy.user.per_second: must be between 1 and 1000000 (leave the bucket out for no limit), got 0",
        "limits.buy.user.burst: must be between 1 and 10000000 (leave the bucket out for no limit), got 0",
        "pages.reload_interval_ms: must be at most 3600000 (0 turns reloading off), got 3600001",
    ] {
        assert!(problems.iter().any(|p| p == expected), "{expected} missing from {problems:#?}");
    }
    assert_eq!(problems.len(), 4, "{problems:#?}");
}

#[test]
fn replica_waits_are_off_by_default_and_their_keys_are_bounded_and_named() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(
        (c.redis.wait_replicas, c.redis.wait_timeout),
        (0, Duration::from_millis(500))
    );
    assert_eq!(
        c.redis.call_timeout(),
        c.redis.timeout,
        "no WAIT, no longer bound"
    );
    let c = Config::from_toml_str(
        "[redis]\nwait_replicas = 1\nwait_timeout_ms = 200\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(
        (c.redis.wait_replicas, c.redis.wait_timeout),
        (1, Duration::from_millis(200))
    );
    assert_eq!(
        c.redis.call_timeout(),
        c.redis.timeout + Duration::from_millis(200),
        "a call may queue behind a WAIT"
    );
    let text = "[redis]\nwait_replicas = 17\nwait_timeout_ms = 0\n";
    let Err(ConfigError::Invalid(problems)) = Config::from_toml_str(text, &NoEnv, 0) else {
        panic!("accepted")
    };
    assert_eq!(
        problems,
        [
            "redis.wait_replicas: must be at most 16 (0 = no WAIT), got 17",
            "redis.wait_timeout_ms: must be between 1 and 60000, got 0"
        ],
    );
    let msg = Config::from_toml_str("[redis]\nwait_timeout_ms = 60001\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("redis.wait_timeout_ms: must be between 1 and 60000, got 60001"),
        "{msg}"
    );
    let msg = Config::from_toml_str("[redis]\nwait_replicas = -1\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("wait_replicas"), "{msg}");
}

#[test]
fn parsing_reads_nothing_from_the_machine() {
    // The default consumer name needs the host name: the backend picks it
    // at start; parsing leaves it unset.
    assert_eq!(
        Config::from_toml_str("", &NoEnv, 0)
            .unwrap()
            .backend
            .consumer_name,
        None
    );
    let c = Config::from_toml_str("", &MapEnv(&[("FLASHGATE_CONSUMER_NAME", "pod-7")]), 0).unwrap();
    assert_eq!(c.backend.consumer_name.as_deref(), Some("pod-7"));
    let c = Config::from_toml_str("[backend]\nconsumer_name = \"b1\"\n", &NoEnv, 0).unwrap();
    assert_eq!(c.backend.consumer_name.as_deref(), Some("b1"));
}

#[test]
fn each_redis_mode_builds_its_target() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(
        c.redis.target,
        RedisTarget::Standalone {
            url: "redis://127.0.0.1:6379/".into()
        }
    );
    let c =
        Config::from_toml_str("[redis]\nmode = \"cluster\"\nnodes = [\"redis://127.0.0.1:7100\", \"redis://127.0.0.1:7101\"]\n", &NoEnv, 0)
            .unwrap();
    assert_eq!(
        c.redis.target,
        RedisTarget::Cluster {
            nodes: vec![
                "redis://127.0.0.1:7100".into(),
                "redis://127.0.0.1:7101".into()
            ]
        }
    );
    assert_eq!(c.redis.target.mode(), "cluster");
    let text = "[redis]\nmode = \"sentinel\"\nsentinels = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"shop\"\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert_eq!(
        c.redis.target,
        RedisTarget::Sentinel {
            sentinels: vec!["redis://127.0.0.1:26379".into()],
            master_name: "shop".into()
        }
    );
    for target in [
        RedisTarget::Standalone {
            url: "redis://10.0.0.1:6379/".into(),
        },
        RedisTarget::Cluster {
            nodes: vec!["redis://a:1".into(), "redis://b:2".into()],
        },
        RedisTarget::Sentinel {
            sentinels: vec!["redis://s:26379".into()],
            master_name: "m".into(),
        },
    ] {
        let text = format!("[redis]\n{}\n", target.to_toml());
        assert_eq!(
            Config::from_toml_str(&text, &NoEnv, 0)
                .unwrap()
                .redis
                .target,
            target,
            "{text}"
        );
    }
}

#[test]
fn redis_tls_takes_a_ca_file_for_rediss_urls_in_every_mode_and_refuses_what_would_skip_or_ignore_it(
) {
    let problems = |text: &str| match Config::from_toml_str(text, &NoEnv, 0) {
        Err(ConfigError::Invalid(p)) => p,
        other => panic!("accepted: {other:?}"),
    };
    let c = Config::from_toml_str(
        "[redis]\nurl = \"rediss://10.0.0.1:6380/\"\nca_file = \"ca.pem\"\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(c.redis.ca_file, Some(PathBuf::from("ca.pem")));
    assert_eq!(
        Config::from_toml_str("[redis]\nurl = \"rediss://10.0.0.1:6380/\"\n", &NoEnv, 0)
            .unwrap()
            .redis
            .ca_file,
        None
    );
    let tls_cluster = "[redis]\nmode = \"cluster\"\nnodes = [\"rediss://10.0.0.1:7000\", \"rediss://10.0.0.2:7000\"]\n";
    assert!(
        Config::from_toml_str(tls_cluster, &NoEnv, 0).is_ok(),
        "rediss:// cluster nodes are URLs"
    );
    let tls_sentinels = "[redis]\nmode = \"sentinel\"\nsentinels = [\"rediss://10.0.0.1:26379\"]\nmaster_name = \"m\"\n";
    assert!(
        Config::from_toml_str(tls_sentinels, &NoEnv, 0).is_ok(),
        "rediss:// sentinels are URLs"
    );

    assert_eq!(
        problems("[redis]\nca_file = \"ca.pem\"\n"),
        ["redis.ca_file: needs a rediss:// redis.url (TLS)"]
    );
    assert_eq!(
        problems("[redis]\nurl = \"rediss://10.0.0.1:6380/\"\nca_file = \" \"\n"),
        ["redis.ca_file: must not be empty (leave it out for the system's roots only)"]
    );
    for tls in [tls_cluster, tls_sentinels] {
        let c = Config::from_toml_str(&format!("{tls}ca_file = \"ca.pem\"\n"), &NoEnv, 0).unwrap();
        assert_eq!(c.redis.ca_file, Some(PathBuf::from("ca.pem")), "{tls}");
    }
    assert_eq!(
        problems("[redis]\nmode = \"cluster\"\nnodes = [\"redis://10.0.0.1:7000\"]\nca_file = \"ca.pem\"\n"),
        ["redis.ca_file: needs rediss:// redis.nodes (TLS)"]
    );
    assert_eq!(
        problems("[redis]\nmode = \"sentinel\"\nsentinels = [\"redis://10.0.0.1:26379\"]\nmaster_name = \"m\"\nca_file = \"ca.pem\"\n"),
        ["redis.ca_file: needs rediss:// redis.sentinels (TLS)"]
    );
    let err = problems("[redis]\nurl = \"rediss://10.0.0.1:6380/#insecure\"\n").join("\n");
    assert!(
        err.starts_with("redis.url: `#insecure` turns off the check of the server's certificate"),
        "{err}"
    );
    let err =
        problems("[redis]\nmode = \"cluster\"\nnodes = [\"rediss://a:1/#insecure\"]\n").join("\n");
    assert!(err.starts_with("redis.nodes[0]: `#insecure`"), "{err}");
    assert_eq!(
        problems("[redis]\nmode = \"cluster\"\nnodes = [\"rediss://a:1\", \"redis://b:2\"]\n"),
        ["redis.nodes: mixes redis:// and rediss:// URLs: use one scheme for every node"]
    );
}

#[test]
fn a_redis_mode_without_its_keys_or_with_another_modes_keys_is_refused_by_key() {
    let problems = |text: &str| match Config::from_toml_str(text, &NoEnv, 0) {
        Err(ConfigError::Invalid(p)) => p,
        other => panic!("accepted: {other:?}"),
    };
    assert_eq!(
        problems("[redis]\nmode = \"cluster\"\n"),
        ["redis.nodes: cluster mode needs at least one seed node"]
    );
    assert_eq!(
        problems("[redis]\nmode = \"cluster\"\nnodes = [\"http://x:1\"]\nurl = \"redis://10.0.0.1:6379/\"\n"),
        ["redis.url: not used in cluster mode", "redis.nodes[0]: `http://x:1` is not a redis:// or rediss:// URL"]
    );
    assert_eq!(
        problems("[redis]\nmode = \"sentinel\"\n"),
        [
            "redis.sentinels: sentinel mode needs at least one sentinel",
            "redis.master_name: sentinel mode needs the name the sentinels monitor the primary under"
        ]
    );
    assert_eq!(
        problems("[redis]\nnodes = [\"redis://127.0.0.1:7100\"]\nmaster_name = \"m\"\n"),
        [
            "redis.nodes: only used with mode = \"cluster\"",
            "redis.master_name: only used with mode = \"sentinel\""
        ]
    );
    let err = Config::from_toml_str("[redis]\nmode = \"clustered\"\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("clustered") && err.contains("standalone"),
        "{err}"
    );
}

#[test]
fn a_challenge_must_expire_before_the_won_keys_it_could_be_re_sent_with() {
    let msg =
        Config::from_toml_str("[gateway]\nidempotency_ttl_seconds = 120\n[challenge]\nmode = \"always\"\nttl_seconds = 300\n", &NoEnv, 0)
            .unwrap_err()
            .to_string();
    assert!(msg.contains("challenge.ttl_seconds: must be at least 60 s below gateway.idempotency_ttl_seconds (120)"), "{msg}");
    assert!(
        Config::from_toml_str(
            "[gateway]\nidempotency_ttl_seconds = 120\n[challenge]\nttl_seconds = 300\n",
            &NoEnv,
            0
        )
        .is_ok(),
        "off: no constraint"
    );
}

#[test]
fn challenge_keys_are_checked_with_their_names() {
    let text = "[challenge]\ndifficulty_bits = 33\nmax_difficulty_bits = 40\nttl_seconds = 5\nuser_rate_per_minute = 0\n";
    let msg = Config::from_toml_str(text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for expected in [
        "challenge.difficulty_bits: must be between 0 and 32 (each bit doubles the work), got 33",
        "challenge.max_difficulty_bits: must be between 32 and 32, got 40",
        "challenge.ttl_seconds: must be between 10 and 3600, got 5",
        "challenge.user_rate_per_minute: must be between 1 and 1000000, got 0",
    ] {
        assert!(msg.contains(expected), "{expected} missing from {msg}");
    }
    let msg = Config::from_toml_str(
        "[challenge]\ndifficulty_bits = 16\nmax_difficulty_bits = 12\n",
        &NoEnv,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("challenge.max_difficulty_bits: must be between 16 and 32, got 12"),
        "{msg}"
    );
    let msg = Config::from_toml_str("[challenge]\nmode = \"sometimes\"\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("sometimes"), "{msg}");
}

#[test]
fn a_checkout_url_is_validated_and_its_handoff_needs_the_secret() {
    let sale = |url: &str| {
        format!("[[sales]]\nid = \"d\"\nname = \"D\"\nstock = 1\ncheckout_url = \"{url}\"\n")
    };
    let err = Config::from_toml_str(&sale("https://shop/{user}"), &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sales[0].checkout_url: unknown placeholder `{user}`"),
        "{err}"
    );
    let needs = sale("https://shop/?t={handoff}");
    let err = Config::from_toml_str(&needs, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sales[0].checkout_url: uses {handoff}, which needs FLASHGATE_HANDOFF_SECRET"),
        "{err}"
    );
    let env = MapEnv(&[(
        "FLASHGATE_HANDOFF_SECRET",
        "a-handoff-secret-of-32-bytes-or-more",
    )]);
    let config = Config::from_toml_str(&needs, &env, 0).unwrap();
    assert_eq!(
        config.sales[0].checkout_url.as_deref(),
        Some("https://shop/?t={handoff}")
    );
    assert_eq!(config.gateway.handoff_ttl, Duration::from_secs(600));
    let plain = Config::from_toml_str(&sale("https://shop/{reservation_id}"), &NoEnv, 0).unwrap();
    assert!(
        plain.handoff_secret.is_none(),
        "no {{handoff}}, no secret needed"
    );
    let short = MapEnv(&[("FLASHGATE_HANDOFF_SECRET", "short")]);
    let err = Config::from_toml_str("", &short, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("FLASHGATE_HANDOFF_SECRET: must be at least 32 bytes"),
        "{err}"
    );
    let err = Config::from_toml_str("[gateway]\nhandoff_ttl_seconds = 5\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.handoff_ttl_seconds: must be between 10 and 86400"),
        "{err}"
    );
}

#[test]
fn the_challenge_secret_is_required_only_when_challenges_are_on() {
    let off = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(off.challenge.mode, ChallengeMode::Off);
    assert_eq!(off.required_challenge_secret(), Ok(None));
    let on = Config::from_toml_str("[challenge]\nmode = \"adaptive\"\n", &NoEnv, 0).unwrap();
    let err = on.required_challenge_secret().unwrap_err().to_string();
    assert!(err.contains("FLASHGATE_CHALLENGE_SECRET"), "{err}");
    let env = MapEnv(&[(
        "FLASHGATE_CHALLENGE_SECRET",
        "a-challenge-secret-of-32-bytes-or-more",
    )]);
    let on = Config::from_toml_str("[challenge]\nmode = \"always\"\n", &env, 0).unwrap();
    assert_eq!(
        on.required_challenge_secret(),
        Ok(Some("a-challenge-secret-of-32-bytes-or-more"))
    );
    let short = Config::from_toml_str("", &MapEnv(&[("FLASHGATE_CHALLENGE_SECRET", "short")]), 0)
        .unwrap_err()
        .to_string();
    assert!(
        short.contains("FLASHGATE_CHALLENGE_SECRET") && short.contains("at least 32 bytes"),
        "{short}"
    );
}

#[test]
fn the_shop_cache_tag_header_defaults_to_surrogate_key_and_must_be_a_header_name() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(c.shop.cache.tag_header, "surrogate-key");
    assert!(!c.shop.cache.forward_tag_header);
    let c = Config::from_toml_str(
        "[shop.cache]\ntag_header = \"Cache-Tag\"\nforward_tag_header = true\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(c.shop.cache.tag_header, "cache-tag");
    assert!(c.shop.cache.forward_tag_header);
    for bad in ["", "Cache Tag", "x\\u00e9"] {
        let text = format!("[shop.cache]\ntag_header = \"{bad}\"\n");
        let msg = Config::from_toml_str(&text, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shop.cache.tag_header: must be a header name"),
            "{msg}"
        );
    }
}

#[test]
fn the_shop_cache_is_off_by_default_and_its_bounds_are_named() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert!(!c.shop.cache.enabled);
    assert_eq!(c.shop.cache.max_bytes, 128 << 20);
    let text =
        "[shop]\nread_timeout_ms = 250\n[shop.cache]\nenabled = true\nmax_bytes = 2097152\nmax_object_bytes = 4096\nstale_if_error_seconds = 0\nlock_timeout_ms = 250\n";
    let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
    assert!(c.shop.cache.enabled);
    assert_eq!(
        (c.shop.cache.max_bytes, c.shop.cache.max_object_bytes),
        (2 << 20, 4096)
    );
    assert_eq!(
        (c.shop.cache.stale_if_error, c.shop.cache.lock_timeout),
        (Duration::ZERO, Duration::from_millis(250))
    );
    let bad =
        "[shop.cache]\nmax_bytes = 1024\nmax_object_bytes = 4194304\nstale_if_error_seconds = 100000\nlock_timeout_ms = 0\nsize = 1\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown field `size`"), "{msg}");
    let bad = "[shop.cache]\nmax_bytes = 1048576\nmax_object_bytes = 4194304\nstale_if_error_seconds = 100000\nlock_timeout_ms = 0\n";
    let msg = Config::from_toml_str(bad, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for key in [
        "shop.cache.max_object_bytes",
        "shop.cache.stale_if_error_seconds",
        "shop.cache.lock_timeout_ms",
    ] {
        assert!(msg.contains(key), "{key} not named: {msg}");
    }
    let msg = Config::from_toml_str("[shop.cache]\nlock_timeout_ms = 5000\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shop.cache.lock_timeout_ms: must be between 30000")
            && msg.contains("shop.read_timeout_ms"),
        "{msg}"
    );
    let msg = Config::from_toml_str(
        "[shop.cache]\nmax_bytes = 1048576\nmax_object_bytes = 524288\n",
        &NoEnv,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("shop.cache.max_object_bytes") && msg.contains("a quarter"),
        "{msg}"
    );
    let msg = Config::from_toml_str("[shop.cache]\nmax_bytes = 1024\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shop.cache.max_bytes: must be between 1048576 and"),
        "{msg}"
    );
}

#[test]
fn cache_rules_are_read_in_order_with_safe_defaults() {
    let text = r#"
[[shop.cache.rules]]
path = "/account/"
bypass = true
[[shop.cache.rules]]
path = "/products/*/reviews"
methods = ["get"]
statuses = [200, 404]
ttl_seconds = 30
ignore_cookies = ["_ga*", "cookie_consent"]
key_cookies = ["currency"]
stale_if_error_seconds = 600
stale_while_revalidate_seconds = 10
[[shop.cache.rules]]
path = "/"
"#;
    let rules = Config::from_toml_str(text, &NoEnv, 0)
        .unwrap()
        .shop
        .cache
        .rules;
    assert_eq!(rules.len(), 3);
    assert!(rules[0].bypass);
    assert_eq!(rules[0].path, PathPattern::Prefix("/account/".into()));
    assert_eq!(rules[0].methods, [RuleMethod::Get, RuleMethod::Head]);
    let r = &rules[1];
    assert_eq!(r.path, PathPattern::Glob("/products/*/reviews".into()));
    assert_eq!(r.methods, [RuleMethod::Get]);
    assert_eq!(r.statuses, [200, 404]);
    assert_eq!(r.ttl, Some(Duration::from_secs(30)));
    assert_eq!(
        r.ignore_cookies,
        [
            CookieName::Prefix("_ga".into()),
            CookieName::Exact("cookie_consent".into())
        ]
    );
    assert_eq!(r.key_cookies, ["currency"]);
    assert_eq!(r.stale_if_error, Some(Duration::from_secs(600)));
    assert_eq!(r.stale_while_revalidate, Some(Duration::from_secs(10)));
    let plain = &rules[2];
    assert_eq!(plain.statuses, [200]);
    assert_eq!((plain.ttl, plain.bypass), (None, false));
    assert!(plain.ignore_cookies.is_empty() && plain.key_cookies.is_empty());
    assert!(Config::from_toml_str("", &NoEnv, 0)
        .unwrap()
        .shop
        .cache
        .rules
        .is_empty());
}

#[test]
fn a_bad_cache_rule_is_refused_naming_its_index_and_key() {
    let text = r#"
[[shop.cache.rules]]
path = "/ok/"
[[shop.cache.rules]]
path = "products"
methods = ["POST"]
statuses = [500]
ttl_seconds = 0
ignore_cookies = ["bad name", "_ga*"]
key_cookies = ["_gac"]
[[shop.cache.rules]]
path = "/x/"
bypass = true
ttl_seconds = 10
[[shop.cache.rules]]
path = "/y/"
methods = []
key_cookies = ["a*"]
stale_if_error_seconds = 99999999999
"#;
    let msg = Config::from_toml_str(text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    for expected in [
        "shop.cache.rules[1].path: must be a path starting with `/`",
        "shop.cache.rules[1].methods: `POST` is not cached",
        "shop.cache.rules[1].statuses: 500 is never stored",
        "shop.cache.rules[1].ttl_seconds: must be between 1 and",
        "shop.cache.rules[1].ignore_cookies: `bad name` is not a cookie name",
        "shop.cache.rules[1].key_cookies: `_gac` is also ignored",
        "shop.cache.rules[2].bypass: a bypass rule caches nothing",
        "shop.cache.rules[3].methods: must name GET, HEAD or both",
        "shop.cache.rules[3].key_cookies: `a*` is not a cookie name",
        "shop.cache.rules[3].stale_if_error_seconds: must be between 0 and",
    ] {
        assert!(msg.contains(expected), "missing {expected:?} in: {msg}");
    }
    assert!(!msg.contains("rules[0]"), "{msg}");
    let many: String = (0..=MAX_CACHE_RULES)
        .map(|i| format!("[[shop.cache.rules]]\npath = \"/p{i}/\"\n"))
        .collect();
    let msg = Config::from_toml_str(&many, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!(
            "shop.cache.rules: must be at most {MAX_CACHE_RULES}"
        )),
        "{msg}"
    );
    let cookies: Vec<String> = (0..=MAX_RULE_COOKIES)
        .map(|i| format!("\"c{i}\""))
        .collect();
    let text = format!(
        "[[shop.cache.rules]]\npath = \"/\"\nignore_cookies = [{}]\n",
        cookies.join(", ")
    );
    let msg = Config::from_toml_str(&text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shop.cache.rules[0].ignore_cookies: must be at most 64"),
        "{msg}"
    );
    let msg = Config::from_toml_str("[[shop.cache.rules]]\npath = \"/\"\nttl = 5\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown field `ttl`"), "{msg}");
}

#[test]
fn tls_is_off_unless_cert_file_is_set_and_its_keys_need_it() {
    let parse = |text: &str| Config::from_toml_str(text, &NoEnv, 0);
    assert!(parse("").unwrap().gateway.tls.is_none());
    let on = parse("[gateway.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nredirect_http = true\n[[gateway.tls.certificates]]\ncert_file = \"a.pem\"\nkey_file = \"a.key\"\n").unwrap();
    let tls = on.gateway.tls.unwrap();
    assert_eq!(tls.listen.to_string(), "0.0.0.0:8443");
    assert!(tls.redirect_http);
    assert_eq!(tls.certificates[0].key_path, "gateway.tls.certificates[0]");
    let err = parse("[gateway.tls]\ncert_file = \"c.pem\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.key_file: must be set with gateway.tls.cert_file"),
        "{err}"
    );
    let err = parse("[gateway.tls]\nredirect_http = true\nlisten = \"nope\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.redirect_http: needs gateway.tls.cert_file")
            && err.contains("gateway.tls.listen"),
        "{err}"
    );
    let err = parse("[gateway.tls]\nlisten = \"127.0.0.1:9443\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.listen: needs gateway.tls.cert_file"),
        "{err}"
    );
    let err = parse("[gateway.tls]\nreload_interval_ms = 5000\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.reload_interval_ms: needs gateway.tls.cert_file"),
        "{err}"
    );
    let err = parse("[gateway.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nlisten = \"nope\"\nreload_interval_ms = 1\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.listen") && err.contains("gateway.tls.reload_interval_ms"),
        "{err}"
    );
    let err = parse("[gateway.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\ncert = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `cert`"), "{err}");
    let err = parse("[gateway]\nlisten = \"0.0.0.0:8443\"\n[gateway.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.listen: must differ from gateway.listen"),
        "{err}"
    );
    assert!(parse("[shop]\nh2 = true\n").unwrap().shop.h2);
}

#[test]
fn the_redirect_names_redirect_port_else_the_listen_port() {
    let parse = |extra: &str| {
        Config::from_toml_str(
            &format!("[gateway.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nlisten = \"0.0.0.0:8443\"\n{extra}"),
            &NoEnv,
            0,
        )
    };
    assert_eq!(parse("").unwrap().gateway.tls.unwrap().redirect_port, 8443);
    assert_eq!(
        parse("redirect_port = 443\n")
            .unwrap()
            .gateway
            .tls
            .unwrap()
            .redirect_port,
        443
    );
    let err = parse("redirect_port = 0\n").unwrap_err().to_string();
    assert!(
        err.contains("gateway.tls.redirect_port: must be a port between 1 and 65535, got 0"),
        "{err}"
    );
    let err = parse("redirect_port = 70000\n").unwrap_err().to_string();
    assert!(err.contains("redirect_port"), "{err}");
    let err = Config::from_toml_str("[gateway.tls]\nredirect_port = 443\n", &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gateway.tls.redirect_port: needs gateway.tls.cert_file"),
        "{err}"
    );
}

#[test]
fn draw_windows_out_of_bounds_are_refused_by_key() {
    let c = Config::from_toml_str("[fairness]\nwindow_ms = 200\n", &NoEnv, 0).unwrap();
    assert_eq!(c.fairness.window_ms, 200);
    assert_eq!(c.fairness.settle, std::time::Duration::from_millis(5000));
    for (toml, key) in [
        ("[fairness]\nwindow_ms = -1\n", "fairness.window_ms"),
        ("[fairness]\nwindow_ms = 60001\n", "fairness.window_ms"),
        ("[fairness]\nsettle_ms = 10\n", "fairness.settle_ms"),
        (
            "[[sales]]\nid = \"s\"\nname = \"S\"\nstock = 1\ndraw_window_ms = -5\n",
            "sales[0].draw_window_ms",
        ),
        (
            "[[sales]]\nid = \"s\"\nname = \"S\"\nstock = 1\ndraw_window_ms = 100000\n",
            "sales[0].draw_window_ms",
        ),
    ] {
        let msg = Config::from_toml_str(toml, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&format!("{key}:")), "{toml}: {msg}");
    }
    let c = Config::from_toml_str(
        "[[sales]]\nid = \"s\"\nname = \"S\"\nstock = 1\ndraw_window_ms = 0\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(c.sales[0].draw_window_ms, Some(0));
}

#[test]
fn draw_windows_are_refused_on_redis_cluster_by_key_and_mode() {
    let cluster = "[redis]\nmode = \"cluster\"\nnodes = [\"redis://127.0.0.1:7100\"]\n";
    for (extra, key) in [
        ("[fairness]\nwindow_ms = 200\n", "fairness.window_ms"),
        (
            "[[sales]]\nid = \"s\"\nname = \"S\"\nstock = 1\ndraw_window_ms = 100\n",
            "sales[0].draw_window_ms",
        ),
    ] {
        let msg = Config::from_toml_str(&format!("{cluster}{extra}"), &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("{key}:")) && msg.contains("cluster"),
            "{extra}: {msg}"
        );
    }
    let c =
        Config::from_toml_str(&format!("{cluster}[fairness]\nwindow_ms = 0\n"), &NoEnv, 0).unwrap();
    assert_eq!(c.fairness.window_ms, 0);
}

#[test]
fn sale_buckets_default_to_one_and_bad_counts_or_draws_are_refused_by_key() {
    let sale = "[[sales]]\nid = \"s\"\nname = \"S\"\nstock = 10\n";
    assert_eq!(
        Config::from_toml_str(sale, &NoEnv, 0).unwrap().sales[0].buckets,
        1
    );
    assert_eq!(
        Config::from_toml_str(&format!("{sale}buckets = 6\n"), &NoEnv, 0)
            .unwrap()
            .sales[0]
            .buckets,
        6
    );
    for toml in [
        format!("{sale}buckets = 0\n"),
        format!("{sale}buckets = 65\n"),
        format!("{sale}buckets = 4\ndraw_window_ms = 100\n"),
        format!("[fairness]\nwindow_ms = 200\n{sale}buckets = 4\n"),
    ] {
        let msg = Config::from_toml_str(&toml, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("sales[0].buckets:"), "{toml}: {msg}");
    }
    let c = Config::from_toml_str(
        &format!("[fairness]\nwindow_ms = 200\n{sale}buckets = 4\ndraw_window_ms = 0\n"),
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(
        c.sales[0].buckets, 4,
        "a bucketed sale may opt out of the shared draw window"
    );
}

#[test]
fn the_forward_grace_is_bounded_and_leaves_half_the_claim_idle_time_for_the_write() {
    assert_eq!(
        Config::from_toml_str("", &NoEnv, 0)
            .unwrap()
            .backend
            .forward_grace
            .as_millis(),
        1000
    );
    let c = Config::from_toml_str(
        "[backend]\nforward_grace_ms = 0\nclaim_idle_ms = 100\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert!(
        c.backend.forward_grace.is_zero(),
        "no grace fits any claim time"
    );
    let c = Config::from_toml_str(
        "[backend]\nforward_grace_ms = 4500\nclaim_idle_ms = 10000\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(
        c.backend.forward_grace.as_millis(),
        4500,
        "(10000 - 1000) / 2 is the most"
    );
    for text in [
        "[backend]\nforward_grace_ms = 60001\nclaim_idle_ms = 200000\n",
        "[backend]\nforward_grace_ms = 4501\nclaim_idle_ms = 10000\n",
        "[backend]\nforward_grace_ms = 2000\nclaim_idle_ms = 2000\n",
    ] {
        let msg = Config::from_toml_str(text, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("backend.forward_grace_ms"), "{msg}");
    }
}

#[test]
fn algorithms_default_to_what_the_keys_allow() {
    let secret = MapEnv(&[(ENV_JWT_SECRET, "0123456789abcdef0123456789abcdef")]);
    let algs =
        |text: &str, env: &dyn Env| Config::from_toml_str(text, env, 0).unwrap().auth.algorithms;
    use JwtAlgorithm::*;
    assert_eq!(algs("", &NoEnv), [HS256]);
    assert_eq!(algs("", &secret), [HS256]);
    let url = "[auth]\njwks_url = \"https://id.example/jwks.json\"\n";
    assert_eq!(algs(url, &NoEnv), [RS256, ES256, EdDSA]);
    assert_eq!(algs(url, &secret), [HS256, RS256, ES256, EdDSA]);
    let c = Config::from_toml_str(
        "[auth]\njwks_file = \"/etc/fg/jwks.json\"\nalgorithms = [\"ES256\"]\njwks_refetch_interval_ms = 500\ncookie = \"fg_token\"\npublic_origin = \"https://Shop.example:8443\"\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(c.auth.algorithms, [ES256]);
    let jwks = c.auth.jwks.unwrap();
    assert_eq!(jwks.source, JwksSource::File("/etc/fg/jwks.json".into()));
    assert_eq!(jwks.refetch_interval, Duration::from_millis(500));
    assert_eq!(jwks.refresh, Duration::from_secs(300));
    assert_eq!(c.auth.cookie.as_deref(), Some("fg_token"));
    assert_eq!(
        c.auth.public_origin.as_deref(),
        Some("https://shop.example:8443")
    );
}

#[test]
fn auth_keys_are_checked_and_named() {
    let cases = [
        (
            "[auth]\nalgorithms = [\"RS256\"]\n",
            "auth.algorithms: RS256 needs auth.jwks_url or auth.jwks_file",
        ),
        (
            "[auth]\nalgorithms = [\"HS256\"]\n",
            "auth.algorithms: HS256 needs FLASHGATE_JWT_SECRET",
        ),
        (
            "[auth]\nalgorithms = []\n",
            "auth.algorithms: must name at least one",
        ),
        (
            "[auth]\njwks_url = \"https://a/\"\njwks_file = \"b\"\n",
            "auth.jwks_file: set auth.jwks_url or auth.jwks_file, not both",
        ),
        (
            "[auth]\njwks_url = \"ftp://a/\"\n",
            "auth.jwks_url: must be an https:// URL",
        ),
        (
            "[auth]\njwks_url = \"https://\"\n",
            "auth.jwks_url: must be an https:// URL",
        ),
        (
            "[auth]\njwks_url = \"http://id.example/jwks.json\"\n",
            "auth.jwks_url: must be an https:// URL (http:// only to a loopback address",
        ),
        (
            "[auth]\njwks_file = \"j\"\nalgorithms = [\"HS256\"]\n[gateway]\n",
            "auth.jwks_file: is set, but auth.algorithms allows none",
        ),
        (
            "[auth]\njwks_refetch_interval_ms = 10\n",
            "auth.jwks_refetch_interval_ms: must be between 100",
        ),
        (
            "[auth]\njwks_timeout_ms = 0\n",
            "auth.jwks_timeout_ms: must be between 100",
        ),
        (
            "[auth]\njwks_refresh_seconds = 1\n",
            "auth.jwks_refresh_seconds: must be between 10",
        ),
        (
            "[auth]\ncookie = \"a b\"\n",
            "auth.cookie: must be a cookie name",
        ),
        (
            "[auth]\ncookie = \"\"\n",
            "auth.cookie: must be a cookie name",
        ),
        (
            "[auth]\npublic_origin = \"https://shop.example/\"\n",
            "auth.public_origin: must be an origin",
        ),
        (
            "[auth]\npublic_origin = \"shop.example\"\n",
            "auth.public_origin: must be an origin",
        ),
        (
            "[auth]\npublic_origin = \"https://shop.example:0\"\n",
            "auth.public_origin: must be an origin",
        ),
    ];
    for (text, expected) in cases {
        let msg = Config::from_toml_str(text, &NoEnv, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(expected), "{text:?}: {msg}");
    }
    let err = Config::from_toml_str("[auth]\nalgorithms = [\"none\"]\n", &NoEnv, 0).unwrap_err();
    assert!(err.to_string().contains("none"), "{err}");
    for origin in [
        "http://127.0.0.1:8080",
        "https://[::1]:8443",
        "https://shop.example",
    ] {
        let text = format!("[auth]\npublic_origin = \"{origin}\"\n");
        assert!(Config::from_toml_str(&text, &NoEnv, 0).is_ok(), "{origin}");
    }
}

#[test]
fn shop_compression_is_off_by_default_and_its_levels_are_named() {
    let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
    assert_eq!(c.shop.compression, None);
    let c = Config::from_toml_str(
        "[shop.compression]\nenabled = true\nzstd_level = 0\n",
        &NoEnv,
        0,
    )
    .unwrap();
    assert_eq!(
        c.shop.compression,
        Some(CompressionLevels {
            gzip: 6,
            brotli: 5,
            zstd: 0
        })
    );
    let msg = Config::from_toml_str(
        "[shop.compression]\ngzip_level = 10\nbrotli_level = 12\n",
        &NoEnv,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("shop.compression.gzip_level")
            && msg.contains("shop.compression.brotli_level"),
        "{msg}"
    );
    let off =
        "[shop.compression]\nenabled = true\ngzip_level = 0\nbrotli_level = 0\nzstd_level = 0\n";
    let msg = Config::from_toml_str(off, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shop.compression.enabled: every level is 0"),
        "{msg}"
    );
}
