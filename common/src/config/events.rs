//! `[events]`: order events to the shop (`order.created`, `order.paid`,
//! `order.cancelled`), delivered by the backend from its outbox to a webhook
//! signed as Standard Webhooks specifies (<https://www.standardwebhooks.com/>),
//! to an AMQP exchange, or both. Off unless `webhook_url` or `amqp_url` is
//! set. The webhook's signing secret comes from the environment only
//! (`FLASHGATE_WEBHOOK_SECRET`), required when `webhook_url` is set, and
//! written as that spec writes it (`whsec_` and the base64 of the key), so
//! the shop hands the same string to the spec's libraries.
//!
//! Both destinations may be reached over TLS (`https://`, `amqps://`); the
//! destination's certificate is verified against the system's roots plus
//! the CA certificates of `ca_file`, which the backend reads at start
//! (parsing here reads no file).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::check::Check;
use super::env::{Env, ENV_WEBHOOK_SECRET};

/// The file's `[events]` table.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Events {
    /// Unset: no webhook.
    pub webhook_url: Option<String>,
    pub send_timeout_ms: u64,
    /// Unset: no AMQP.
    pub amqp_url: Option<String>,
    /// PEM file of CA certificates trusted, besides the system's roots,
    /// for an `https://` webhook or an `amqps://` broker: a shop or broker
    /// with a certificate from a private CA.
    pub ca_file: Option<String>,
    pub exchange: String,
    pub routing_key_created: String,
    pub routing_key_paid: String,
    pub routing_key_cancelled: String,
    pub max_attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    pub poll_ms: u64,
    pub lease_ms: u64,
    pub batch_size: u32,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            webhook_url: None,
            send_timeout_ms: 10_000,
            amqp_url: None,
            ca_file: None,
            exchange: "flashgate.orders".into(),
            routing_key_created: "order.created".into(),
            routing_key_paid: "order.paid".into(),
            routing_key_cancelled: "order.cancelled".into(),
            max_attempts: 12,
            backoff_initial_ms: 1000,
            backoff_max_ms: 300_000,
            poll_ms: 200,
            lease_ms: 60_000,
            batch_size: 16,
        }
    }
}

/// The signed webhook.
#[derive(Clone)]
pub struct WebhookConfig {
    pub url: String,
    /// HMAC-SHA256 key of `webhook-signature`: the bytes of
    /// `FLASHGATE_WEBHOOK_SECRET` after `whsec_`, base64-decoded.
    pub key: Vec<u8>,
    /// One delivery gives up after this long (and counts as failed).
    pub timeout: Duration,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url)
            .field("key", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The AMQP exchange.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    pub url: String,
    /// A publish not confirmed within this long counts as failed.
    pub timeout: Duration,
    /// A durable topic exchange, declared by the backend if absent.
    pub exchange: String,
    pub routing_key_created: String,
    pub routing_key_paid: String,
    pub routing_key_cancelled: String,
}

/// `[events]`, validated.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    pub webhook: Option<WebhookConfig>,
    pub amqp: Option<AmqpConfig>,
    /// CA certificates (PEM) added to the system's roots for the TLS
    /// destinations; read and checked by the backend at start, so that a
    /// gateway sharing this file need not have it.
    pub ca_file: Option<PathBuf>,
    /// Attempts after which an event is dead (kept, listed by the admin
    /// API, retried only by an operator).
    pub max_attempts: u32,
    /// Delay after the first failure; doubled per failure up to `backoff_max`,
    /// with jitter.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How often an idle deliverer looks for new events.
    pub poll: Duration,
    /// How long a deliverer holds the events it claimed before another
    /// backend may take them (a crashed deliverer's events wait this long).
    pub lease: Duration,
    /// Events claimed per round, all sent at once (each of another order):
    /// none waits behind another while its lease runs.
    pub batch_size: u32,
}

impl EventsConfig {
    /// Whether any destination is configured (else no outbox rows are written).
    pub fn enabled(&self) -> bool {
        self.webhook.is_some() || self.amqp.is_some()
    }
}

/// Shortest and longest Standard Webhooks key, bytes (the spec's range).
const WEBHOOK_KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The key of a Standard Webhooks secret, `whsec_` and the base64 of 24 to
/// 64 random bytes.
///
/// # Errors
/// What is wrong, naming `FLASHGATE_WEBHOOK_SECRET` (never its value).
pub fn webhook_key(secret: Option<&str>) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let shape = "must be `whsec_` followed by the base64 of 24 to 64 random bytes \
                 (Standard Webhooks), e.g. `whsec_$(openssl rand -base64 32)`";
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return Err(format!("{ENV_WEBHOOK_SECRET} is not set"));
    };
    let Some(encoded) = secret.strip_prefix("whsec_") else {
        return Err(format!("{ENV_WEBHOOK_SECRET}: {shape}"));
    };
    match base64::engine::general_purpose::STANDARD.decode(encoded) {
        Ok(key) if WEBHOOK_KEY_BYTES.contains(&key.len()) => Ok(key),
        Ok(key) => Err(format!(
            "{ENV_WEBHOOK_SECRET}: {shape} (it decodes to {} bytes)",
            key.len()
        )),
        Err(_) => Err(format!(
            "{ENV_WEBHOOK_SECRET}: {shape} (what follows `whsec_` is not base64)"
        )),
    }
}

/// Longest backoff: a day.
const MAX_BACKOFF_MS: u64 = 86_400_000;

fn url_ok(url: &str, schemes: &[&str]) -> bool {
    schemes.iter().any(|scheme| {
        url.strip_prefix(scheme)
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
    }) && !url.chars().any(char::is_whitespace)
}

pub(super) fn events(check: &mut Check, f: Events, env: &dyn Env) -> EventsConfig {
    if let Some(url) = &f.webhook_url {
        // https:// for a shop across a network; http:// for one on the
        // same host or private network.
        check.that(
            url_ok(url, &["https://", "http://"]),
            "events.webhook_url",
            "must be an https:// or http:// URL",
        );
    }
    if let Some(url) = &f.amqp_url {
        check.that(
            url_ok(url, &["amqps://", "amqp://"]),
            "events.amqp_url",
            "must be an amqps:// or amqp:// URL",
        );
    }
    if let Some(path) = &f.ca_file {
        check.that(
            !path.trim().is_empty(),
            "events.ca_file",
            "must be the path of a PEM file of CA certificates (or left out)",
        );
    }
    check.between("events.send_timeout_ms", f.send_timeout_ms, 100, 120_000);
    check.that(
        !f.exchange.is_empty() && f.exchange.len() <= 127,
        "events.exchange",
        "must be 1 to 127 characters",
    );
    for (key, value) in [
        ("events.routing_key_created", &f.routing_key_created),
        ("events.routing_key_paid", &f.routing_key_paid),
        ("events.routing_key_cancelled", &f.routing_key_cancelled),
    ] {
        check.that(value.len() <= 255, key, "must be at most 255 characters");
    }
    check.between("events.max_attempts", f.max_attempts, 1, 1000);
    check.between(
        "events.backoff_initial_ms",
        f.backoff_initial_ms,
        10,
        MAX_BACKOFF_MS,
    );
    check
        .between(
            "events.backoff_max_ms",
            f.backoff_max_ms,
            f.backoff_initial_ms.clamp(10, MAX_BACKOFF_MS),
            MAX_BACKOFF_MS,
        )
        .note("at least backoff_initial_ms");
    check.between("events.poll_ms", f.poll_ms, 10, 60_000);
    // A lease shorter than one delivery would let a second backend send an
    // event the first is still sending. A round sends its whole batch at
    // once (ceil(batch / concurrency) = 1 wave), each event to each
    // destination in turn, each send bounded by send_timeout_ms: one
    // delivery takes at most destinations × send_timeout_ms, plus one more
    // send_timeout_ms for the claim, the database writes and clock skew
    // between backends. The deliverer also skips an event whose remaining
    // lease is under that (a slow claim), leaving it to the next lease.
    let destinations = u64::from(f.webhook_url.is_some()) + u64::from(f.amqp_url.is_some());
    let min_lease = f
        .send_timeout_ms
        .saturating_mul(destinations.max(1) + 1)
        .clamp(1000, 3_600_000);
    check
        .between("events.lease_ms", f.lease_ms, min_lease, 3_600_000)
        .note("at least send_timeout_ms × (destinations + 1)");
    check.between("events.batch_size", f.batch_size, 1, 256);
    let secret = env.var(ENV_WEBHOOK_SECRET);
    let webhook = f.webhook_url.map(|url| {
        let key = webhook_key(secret.as_deref()).unwrap_or_else(|e| {
            check.problem(format_args!("events.webhook_url is set: {e}"));
            Vec::new()
        });
        WebhookConfig {
            url,
            key,
            timeout: Duration::from_millis(f.send_timeout_ms),
        }
    });
    let amqp = f.amqp_url.map(|url| AmqpConfig {
        url,
        timeout: Duration::from_millis(f.send_timeout_ms),
        exchange: f.exchange,
        routing_key_created: f.routing_key_created,
        routing_key_paid: f.routing_key_paid,
        routing_key_cancelled: f.routing_key_cancelled,
    });
    EventsConfig {
        webhook,
        amqp,
        ca_file: f
            .ca_file
            .filter(|p| !p.trim().is_empty())
            .map(PathBuf::from),
        max_attempts: f.max_attempts,
        backoff_initial: Duration::from_millis(f.backoff_initial_ms),
        backoff_max: Duration::from_millis(f.backoff_max_ms),
        poll: Duration::from_millis(f.poll_ms),
        lease: Duration::from_millis(f.lease_ms),
        batch_size: f.batch_size,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, Env};

    struct Vars(&'static [(&'static str, &'static str)]);
    impl Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            self.0
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// `whsec_` and the base64 of the 32 bytes `0123456789abcdef0123456789abcdef`.
    const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    fn parse(toml: &str, env: &dyn Env) -> Result<Config, String> {
        Config::from_toml_str(toml, env, 0).map_err(|e| e.to_string())
    }

    #[test]
    fn events_are_off_by_default() {
        let config = parse("", &Vars(&[])).unwrap();
        assert!(!config.events.enabled());
    }

    #[test]
    fn a_webhook_needs_its_secret_from_the_environment() {
        let err = parse(
            "[events]\nwebhook_url = \"http://127.0.0.1:8000/hook\"",
            &Vars(&[]),
        )
        .unwrap_err();
        assert!(
            err.contains("events.webhook_url is set: FLASHGATE_WEBHOOK_SECRET is not set"),
            "{err}"
        );
        let err = parse(
            "[events]\nwebhook_url = \"http://127.0.0.1:8000/hook\"",
            &Vars(&[(
                "FLASHGATE_WEBHOOK_SECRET",
                "0123456789abcdef0123456789abcdef",
            )]),
        )
        .unwrap_err();
        assert!(
            err.contains("FLASHGATE_WEBHOOK_SECRET: must be `whsec_` followed by the base64"),
            "{err}"
        );
        for (vars, says) in [
            (
                Vars(&[("FLASHGATE_WEBHOOK_SECRET", "whsec_c2hvcnQ=")]),
                "it decodes to 5 bytes",
            ),
            (
                Vars(&[("FLASHGATE_WEBHOOK_SECRET", "whsec_not base64!")]),
                "is not base64",
            ),
        ] {
            let err = parse(
                "[events]\nwebhook_url = \"http://127.0.0.1:8000/hook\"",
                &vars,
            )
            .unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let config = parse(
            "[events]\nwebhook_url = \"http://127.0.0.1:8000/hook\"",
            &Vars(&[("FLASHGATE_WEBHOOK_SECRET", SECRET)]),
        )
        .unwrap();
        let webhook = config.events.webhook.unwrap();
        assert_eq!(
            (webhook.url.as_str(), webhook.key.as_slice()),
            (
                "http://127.0.0.1:8000/hook",
                b"0123456789abcdef0123456789abcdef".as_slice()
            )
        );
        assert!(config.events.amqp.is_none());
    }

    #[test]
    fn bad_events_values_are_named() {
        let toml = "[events]\nwebhook_url = \"ftp://x\"\namqp_url = \"http://rabbit\"\nmax_attempts = 0\nbackoff_initial_ms = 5000\nbackoff_max_ms = 1000\nlease_ms = 1000\nexchange = \"\"";
        let err = parse(toml, &Vars(&[("FLASHGATE_WEBHOOK_SECRET", SECRET)])).unwrap_err();
        for key in [
            "events.webhook_url: must be an https:// or http:// URL",
            "events.amqp_url: must be an amqps:// or amqp:// URL",
            "events.max_attempts: must be between 1 and 1000",
            "events.backoff_max_ms: must be between 5000 and 86400000",
            "events.lease_ms: must be between 30000 and 3600000",
            "events.exchange: must be 1 to 127 characters",
        ] {
            assert!(err.contains(key), "missing `{key}` in:\n{err}");
        }
    }

    #[test]
    fn amqp_takes_its_exchange_and_routing_keys() {
        let toml =
            "[events]\namqp_url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\nexchange = \"shop\"\nrouting_key_paid = \"orders.paid\"";
        let amqp = parse(toml, &Vars(&[])).unwrap().events.amqp.unwrap();
        assert_eq!(amqp.exchange, "shop");
        assert_eq!(amqp.routing_key_paid, "orders.paid");
        assert_eq!(amqp.routing_key_created, "order.created");
    }

    #[test]
    fn tls_destinations_and_their_ca_file_are_taken() {
        let toml = "[events]\nwebhook_url = \"https://shop.example/hook\"\namqp_url = \"amqps://fg:pw@rabbit.example:5671/%2f\"\nca_file = \"/etc/flashgate/shop-ca.pem\"";
        let events = parse(toml, &Vars(&[("FLASHGATE_WEBHOOK_SECRET", SECRET)]))
            .unwrap()
            .events;
        assert_eq!(events.webhook.unwrap().url, "https://shop.example/hook");
        assert_eq!(
            events.amqp.unwrap().url,
            "amqps://fg:pw@rabbit.example:5671/%2f"
        );
        assert_eq!(
            events.ca_file,
            Some(std::path::PathBuf::from("/etc/flashgate/shop-ca.pem"))
        );
        let plain = parse("[events]\namqp_url = \"amqp://127.0.0.1\"", &Vars(&[]))
            .unwrap()
            .events;
        assert_eq!(plain.ca_file, None, "no ca_file: the system's roots only");
        let err = parse(
            "[events]\namqp_url = \"amqps://\"\nca_file = \" \"",
            &Vars(&[]),
        )
        .unwrap_err();
        assert!(
            err.contains("events.amqp_url: must be an amqps:// or amqp:// URL"),
            "{err}"
        );
        assert!(
            err.contains("events.ca_file: must be the path of a PEM file"),
            "{err}"
        );
    }
}
