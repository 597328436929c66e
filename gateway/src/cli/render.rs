//! The answers as text for a terminal: tables with aligned columns, and
//! `key  value` lists for one object. Missing values print as `-`.

use serde_json::Value;

use super::cell;

/// Columns of `sale list`: (header, field of the sale view).
const SALE_COLUMNS: [(&str, &str); 9] = [
    ("ID", "id"),
    ("NAME", "name"),
    ("STATE", "state"),
    ("STOCK", "stock"),
    ("REMAINING", "remaining"),
    ("RESERVED", "reservations"),
    ("ORDERS", "orders"),
    ("STARTS", "starts_at"),
    ("ENDS", "ends_at"),
];

/// The fields of one sale, in the order an operator reads them.
const SALE_FIELDS: [&str; 14] = [
    "id",
    "name",
    "state",
    "stock",
    "remaining",
    "reservations",
    "orders",
    "pending",
    "per_user_limit",
    "starts_at",
    "ends_at",
    "payment_timeout_seconds",
    "draw_window_ms",
    "buckets",
];

/// The fields of a reconciliation report, the verdict first.
const RECONCILE_FIELDS: [&str; 6] = [
    "sale_id",
    "drift",
    "settled",
    "stock",
    "remaining",
    "live_orders",
];

/// Rows under a header, each column as wide as its widest cell, two
/// spaces apart; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(c);
            if i + 1 < widths.len() {
                let pad = widths[i].saturating_sub(c.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// An object as `key  value` lines: the `first` keys in their order, then
/// the others by name.
pub fn fields(value: &Value, first: &[&str]) -> String {
    let Some(object) = value.as_object() else {
        return format!("{}\n", cell(value));
    };
    let mut keys: Vec<&str> = first
        .iter()
        .copied()
        .filter(|k| object.contains_key(*k))
        .collect();
    keys.extend(
        object
            .keys()
            .map(String::as_str)
            .filter(|k| !first.contains(k)),
    );
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| vec![format!("{k}:"), cell(&object[*k])])
        .collect();
    // No header line: the table of two columns, its first row dropped.
    table(&["", ""], &rows)
        .split_once('\n')
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default()
}

/// The columns of `room list`: header, field.
const ROOM_COLUMNS: [(&str, &str); 8] = [
    ("ROOM", "name"),
    ("MODE", "mode"),
    ("INSIDE", "inside"),
    ("OF", "active_users"),
    ("WAITING", "waiting"),
    ("ADMITTED/MIN", "admission_rate_per_minute"),
    ("WAIT (S)", "estimated_wait_seconds"),
    ("STARTS", "starts_at"),
];

/// A table of `items`, one row each, or `none` when there are none.
fn listing(columns: &[(&str, &str)], items: &Value, none: &str) -> String {
    let items = items.as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        return none.to_owned();
    }
    let header: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| columns.iter().map(|(_, f)| cell(&s[*f])).collect())
        .collect();
    table(&header, &rows)
}

/// `sale list`.
pub fn sales(list: &Value) -> String {
    listing(&SALE_COLUMNS, list, "no sales\n")
}

/// `room list`.
pub fn rooms(answer: &Value) -> String {
    listing(&ROOM_COLUMNS, &answer["rooms"], "no waiting rooms\n")
}

/// `room show` and `room mode`.
pub fn room(view: &Value) -> String {
    fields(
        view,
        &[
            "name",
            "mode",
            "configured_mode",
            "inside",
            "active_users",
            "waiting",
        ],
    )
}

/// `sale show`.
pub fn sale(view: &Value) -> String {
    fields(view, &SALE_FIELDS)
}

/// `sale reconcile`.
pub fn reconcile(report: &Value) -> String {
    fields(report, &RECONCILE_FIELDS)
}

/// `events dead`.
pub fn dead_events(answer: &Value) -> String {
    let events = answer["dead_events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if events.is_empty() {
        return "no dead events\n".to_owned();
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let created = e["created_at_ms"]
                .as_i64()
                .map_or_else(|| "-".to_owned(), flashgate_common::rfc3339);
            vec![
                cell(&e["event_id"]),
                cell(&e["order_id"]),
                cell(&e["seq"]),
                cell(&e["type"]),
                cell(&e["attempts"]),
                created,
                cell(&e["last_error"]),
            ]
        })
        .collect();
    table(
        &[
            "EVENT",
            "ORDER",
            "SEQ",
            "TYPE",
            "ATTEMPTS",
            "CREATED",
            "LAST ERROR",
        ],
        &rows,
    )
}

/// `cache purge`: what was asked, what this gateway removed, and whether
/// the other gateways were told.
pub fn purge(asked: &Value, answer: &Value) -> String {
    let tags = asked["tags"].as_array().map(|tags| {
        tags.iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" ")
    });
    let (kind, path) = match (
        asked["url"].as_str(),
        asked["prefix"].as_str(),
        asked["tag"].as_str(),
    ) {
        (Some(url), _, _) => ("url", url),
        (None, Some(prefix), _) => ("prefix", prefix),
        (None, None, Some(tag)) => ("tag", tag),
        _ => match &tags {
            Some(tags) => ("tags", tags.as_str()),
            None => ("-", "-"),
        },
    };
    let told = match (
        answer["announced"].as_bool() == Some(true),
        answer["recorded"].as_bool() != Some(false),
    ) {
        (true, true) => "announced to the other gateways",
        (true, false) => {
            "announced to the other gateways, but NOT recorded: a gateway away from Redis now misses it"
        }
        _ => "NOT announced to the other gateways (Redis did not take it): purge each gateway",
    };
    format!(
        "purged {} cached responses by {kind} {path}; {told}\n",
        cell(&answer["purged"])
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let out = table(
            &["ID", "NAME", "STOCK"],
            &[
                vec!["demo".into(), "Demo sneaker".into(), "100".into()],
                vec!["a".into(), "B".into(), "7".into()],
            ],
        );
        assert_eq!(
            out,
            "ID    NAME          STOCK\n\
             demo  Demo sneaker  100\n\
             a     B             7\n"
        );
    }

    #[test]
    fn a_sale_lists_its_fields_in_reading_order_and_nulls_as_dashes() {
        let out = sale(&json!({"stock": 5, "id": "x", "remaining": null, "zeta": true}));
        assert_eq!(
            out,
            "id:         x\nstock:      5\nremaining:  -\nzeta:       true\n"
        );
    }

    #[test]
    fn empty_lists_say_so() {
        assert_eq!(sales(&json!([])), "no sales\n");
        assert_eq!(dead_events(&json!({"dead_events": []})), "no dead events\n");
    }

    #[test]
    fn a_purge_says_whether_the_other_gateways_were_told() {
        let asked = json!({"prefix": "/p/"});
        assert_eq!(
            purge(
                &asked,
                &json!({"kind": "prefix", "purged": 2, "announced": true})
            ),
            "purged 2 cached responses by prefix /p/; announced to the other gateways\n"
        );
        assert!(purge(&asked, &json!({"purged": 0, "announced": false})).contains("NOT announced"));
        assert_eq!(
            purge(
                &json!({"tags": ["a", "b"]}),
                &json!({"kind": "tag", "purged": 3, "recorded": true, "announced": true})
            ),
            "purged 3 cached responses by tags a b; announced to the other gateways\n"
        );
        assert!(purge(
            &json!({"tag": "a"}),
            &json!({"purged": 1, "recorded": false, "announced": true})
        )
        .contains("NOT recorded"));
    }
}
