//! The key table of docs/ARCHITECTURE.md ("Redis keys") against the keys
//! `keys.rs` builds, both ways: the table is the one list of keys a reader
//! has, so it must name every key the code builds and nothing else.
//!
//! The code's side is complete by construction: [`sale_keys`] destructures
//! [`SaleKeys`] and [`DrawKeys`] in full (a new field does not compile
//! until it is listed), every name prefix must start a key built from it,
//! and every `pub const` of `keys.rs` whose value starts with `fg:` must be
//! in [`constants`].

use std::collections::BTreeSet;

use super::{
    BuyerKeyPrefixes, DrawKeys, RestoreScratch, RoomKeys, SaleKeys, ARCHIVED_SALES,
    CLUSTER_GLOBAL_LIMIT, EVENTS_CHANNEL, GLOBAL_SWITCH, SALES_INDEX, SHOP_PURGES_STREAM,
    WAIT_MARK_KEY,
};

const ARCHITECTURE: &str = include_str!("../../../docs/ARCHITECTURE.md");
const KEYS_RS: &str = include_str!("../keys.rs");

/// The bucket number standing for the table's `K`.
const BUCKET: u32 = 7;

/// Every key of the key set `keys`, named by what builds it, with the
/// table's placeholders as arguments (`USER`, `KEY`, `NONCE`, `CHALLENGE`,
/// `TOKEN`).
///
/// # Panics
/// When a name prefix of `keys` starts none of the keys listed: its
/// method is missing here.
pub(super) fn sale_keys(keys: &SaleKeys) -> Vec<(&'static str, String)> {
    let SaleKeys {
        meta,
        remaining,
        buyers,
        stream,
        reservations,
        released,
        dead,
        restoring,
        synced,
        restore_prefix,
        pow_prefix,
        wait_mark,
        draw,
        xfer_out,
        xfer_open,
        xfer_in,
        moving,
        xfer_refuse,
    } = keys;
    // The prefixes of a buyer's keys, from which the draw script names an
    // entrant's keys: no key of their own.
    let DrawKeys {
        state,
        entries,
        index,
        outcomes,
        order,
        perm,
        prefix:
            BuyerKeyPrefixes {
                idempotency: idem_prefix,
                call: call_prefix,
                idempotency_misses: idem_misses_prefix,
            },
    } = draw;
    let RestoreScratch {
        buyers: scratch_buyers,
        reservations: scratch_reservations,
        released: scratch_released,
    } = keys.restore_scratch("TOKEN");
    let built = vec![
        ("meta", meta.clone()),
        ("remaining", remaining.clone()),
        ("buyers", buyers.clone()),
        ("stream", stream.clone()),
        ("reservations", reservations.clone()),
        ("released", released.clone()),
        ("dead", dead.clone()),
        ("restoring", restoring.clone()),
        ("synced", synced.clone()),
        ("idempotency", keys.idempotency("USER", "KEY")),
        ("idempotency_misses", keys.idempotency_misses("USER")),
        ("call", keys.call("USER", "NONCE")),
        ("pow", keys.pow("CHALLENGE")),
        ("restore_scratch.buyers", scratch_buyers),
        ("restore_scratch.reservations", scratch_reservations),
        ("restore_scratch.released", scratch_released),
        ("wait_mark", wait_mark.clone()),
        ("draw.state", state.clone()),
        ("draw.entries", entries.clone()),
        ("draw.index", index.clone()),
        ("draw.outcomes", outcomes.clone()),
        ("draw.order", order.clone()),
        ("draw.perm", perm.clone()),
        ("xfer_out", xfer_out.clone()),
        ("xfer_open", xfer_open.clone()),
        ("xfer_in", xfer_in.clone()),
        ("moving", moving.clone()),
        ("xfer_refuse", xfer_refuse.clone()),
    ];
    for prefix in [
        idem_prefix,
        restore_prefix,
        idem_misses_prefix,
        call_prefix,
        pow_prefix,
    ] {
        assert!(
            built
                .iter()
                .any(|(_, key)| key.starts_with(prefix.as_str())),
            "no key listed is built from the prefix {prefix}: list its method"
        );
    }
    built
}

/// The keys outside a sale, by the name of their constant.
fn constants() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SALES_INDEX", SALES_INDEX),
        ("ARCHIVED_SALES", ARCHIVED_SALES),
        ("GLOBAL_SWITCH", GLOBAL_SWITCH),
        ("CLUSTER_GLOBAL_LIMIT", CLUSTER_GLOBAL_LIMIT),
        ("WAIT_MARK_KEY", WAIT_MARK_KEY),
        ("EVENTS_CHANNEL", EVENTS_CHANNEL),
        ("SHOP_PURGES_STREAM", SHOP_PURGES_STREAM),
    ]
}

/// The names of the `pub const`s of `keys.rs` whose value is a key
/// (`"fg:..."`).
fn key_constants_in_source() -> BTreeSet<String> {
    KEYS_RS
        .lines()
        .filter_map(|line| line.strip_prefix("pub const "))
        .filter_map(|rest| {
            let (name, value) = rest.split_once(':')?;
            value.contains("= \"fg:").then(|| name.trim().to_owned())
        })
        .collect()
}

/// Every backquoted name in the first column of the table of the section
/// "Redis keys" of `doc`, in order.
fn table_keys(doc: &str) -> Vec<String> {
    let section = doc
        .split("\n## Redis keys\n")
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a section \"Redis keys\"");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = section.lines().filter(|line| line.starts_with('|'));
    let header = rows.next().expect("the section holds a table");
    assert!(header.starts_with("| Key |"), "{header}");
    let separator = rows.next().expect("the table has a separator line");
    assert!(separator.starts_with("|---"), "{separator}");
    rows.map(|row| row.split('|').nth(1).unwrap_or_default())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

/// What keeps `doc`'s table from being the keys `keys.rs` builds, each
/// named; empty when they agree.
fn disagreements(doc: &str) -> Vec<String> {
    let listed = table_keys(doc);
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for key in &listed {
        if !seen.insert(key.as_str()) {
            problems.push(format!("{key}: listed twice"));
        }
    }
    let in_table = |key: &str| seen.contains(key);
    let mut known = BTreeSet::new();
    for (name, key) in constants() {
        known.insert(key.to_owned());
        if !in_table(key) {
            problems.push(format!("{key} (keys::{name}): missing from the table"));
        }
    }
    let bucket_tag = |key: String| {
        let id = crate::buckets::bucket_id("ID", BUCKET);
        key.replace(&format!("{{sale:{id}}}"), "{sale:ID:bK}")
    };
    let of_sale = sale_keys(&SaleKeys::new("ID"));
    let of_bucket = sale_keys(&SaleKeys::bucket("ID", BUCKET));
    for ((name, key), (_, in_bucket)) in of_sale.into_iter().zip(of_bucket) {
        let in_bucket = bucket_tag(in_bucket);
        match (in_table(&key), in_table(&in_bucket)) {
            (false, false) => problems.push(format!(
                "{key} (SaleKeys {name}): missing from the table (as a sale's or a bucket's key)"
            )),
            (true, true) => problems.push(format!(
                "{key} (SaleKeys {name}): listed both as a sale's and as a bucket's key"
            )),
            _ => {}
        }
        known.insert(key);
        known.insert(in_bucket);
    }
    let RoomKeys {
        queue,
        inside,
        state,
        called,
    } = RoomKeys::new("NAME");
    for (name, key) in [
        ("queue", queue),
        ("inside", inside),
        ("state", state),
        ("called", called),
    ] {
        if !in_table(&key) {
            problems.push(format!("{key} (RoomKeys {name}): missing from the table"));
        }
        known.insert(key);
    }
    for key in &listed {
        if !known.contains(key) {
            problems.push(format!("{key}: listed, but keys.rs builds no such key"));
        }
    }
    problems
}

#[test]
fn the_architecture_key_table_lists_every_key_keys_rs_builds_and_no_other() {
    let problems = disagreements(ARCHITECTURE);
    assert!(
        problems.is_empty(),
        "docs/ARCHITECTURE.md (\"Redis keys\") and common/src/keys.rs disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_key_constant_of_keys_rs_is_checked_against_the_table() {
    let checked: BTreeSet<String> = constants()
        .into_iter()
        .map(|(name, _)| name.to_owned())
        .collect();
    assert_eq!(key_constants_in_source(), checked);
}

#[test]
fn a_table_row_without_a_key_or_a_key_without_a_row_is_named() {
    let bogus = ARCHITECTURE.replacen(
        "| `fg:sales` |",
        "| `fg:{sale:ID}:bogus` | string | nobody | nothing |\n| `fg:sales` |",
        1,
    );
    assert_eq!(
        disagreements(&bogus),
        ["fg:{sale:ID}:bogus: listed, but keys.rs builds no such key"]
    );
    let without_moving = ARCHITECTURE
        .lines()
        .filter(|line| !line.starts_with("| `fg:{sale:ID:bK}:moving` |"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        disagreements(&without_moving),
        ["fg:{sale:ID}:moving (SaleKeys moving): missing from the table (as a sale's or a bucket's key)"]
    );
}
