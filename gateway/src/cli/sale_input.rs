//! The sale file of `sale put`: TOML or JSON, with the keys of a
//! `[[sales]]` entry of the config file, turned into the body of
//! `PUT /admin/sales/{id}`.
//!
//! - `id` may be left out; given, it must be the id on the command line.
//! - `starts_at` left out: now. `ends_at` left out: `starts_at +
//!   duration_seconds` (default 3600), as in the config file; giving both
//!   `ends_at` and `duration_seconds` is refused.
//! - The other keys go to the API as they are (`name`, `stock`,
//!   `per_user_limit`, `payment_timeout_seconds`, `draw_window_ms`,
//!   `buckets`, `checkout_url`), which checks their values; a key it does not know is
//!   refused here, naming it.
//!
//! The format is the file's extension (`.toml`, `.json`); for `-` (stdin)
//! or another name, a body starting with `{` is JSON, anything else TOML.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::error::CliError;

/// What a sale lasts when the file gives neither `ends_at` nor
/// `duration_seconds` (the config file's default).
const DEFAULT_DURATION_SECONDS: i64 = 3600;

/// The sale file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SaleFile {
    id: Option<String>,
    name: String,
    stock: i64,
    per_user_limit: Option<i64>,
    starts_at: Option<String>,
    ends_at: Option<String>,
    duration_seconds: Option<i64>,
    payment_timeout_seconds: Option<i64>,
    draw_window_ms: Option<i64>,
    buckets: Option<i64>,
    checkout_url: Option<String>,
}

/// How the file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Toml,
    Json,
}

/// Reads the sale file at `path` (`-`: stdin) for sale `id`; `now_ms`
/// fills in a missing start.
///
/// # Errors
/// The file cannot be read or parsed, names another id, or times its end
/// twice; the message names the file and the key.
pub fn read(path: &Path, id: &str, now_ms: i64) -> Result<Value, CliError> {
    let fail = |message: String| CliError::SaleFile {
        path: path.to_owned(),
        message,
    };
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| fail(e.to_string()))?;
        text
    } else {
        std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?
    };
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => Format::Toml,
        Some("json") => Format::Json,
        _ if text.trim_start().starts_with('{') => Format::Json,
        _ => Format::Toml,
    };
    parse(&text, format, id, now_ms).map_err(fail)
}

/// The API body of a sale file's text.
fn parse(text: &str, format: Format, id: &str, now_ms: i64) -> Result<Value, String> {
    let file: SaleFile = match format {
        Format::Toml => toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?,
        Format::Json => serde_json::from_str(text).map_err(|e| e.to_string())?,
    };
    if let Some(named) = &file.id {
        if named != id {
            return Err(format!(
                "id: the file is sale `{named}`, the command names `{id}`"
            ));
        }
    }
    let starts_at = file
        .starts_at
        .unwrap_or_else(|| flashgate_common::rfc3339(now_ms));
    let ends_at = match (file.ends_at, file.duration_seconds) {
        (Some(_), Some(_)) => {
            return Err("give ends_at or duration_seconds, not both".to_owned());
        }
        (Some(ends_at), None) => ends_at,
        (None, duration) => {
            let duration = duration.unwrap_or(DEFAULT_DURATION_SECONDS);
            if duration <= 0 {
                return Err("duration_seconds: must be > 0".to_owned());
            }
            let starts_ms = flashgate_common::parse_rfc3339("starts_at", &starts_at)
                .map_err(|e| e.to_string())?;
            let ends_ms = duration
                .checked_mul(1000)
                .and_then(|d| d.checked_add(starts_ms))
                .ok_or("duration_seconds: out of range")?;
            flashgate_common::rfc3339(ends_ms)
        }
    };
    let mut body = json!({
        "name": file.name,
        "stock": file.stock,
        "starts_at": starts_at,
        "ends_at": ends_at,
    });
    let optional = [
        ("per_user_limit", file.per_user_limit),
        ("payment_timeout_seconds", file.payment_timeout_seconds),
        ("draw_window_ms", file.draw_window_ms),
        ("buckets", file.buckets),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            body[key] = json!(v);
        }
    }
    if let Some(url) = file.checkout_url {
        body["checkout_url"] = json!(url);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T10:00:00Z.
    const NOW: i64 = 1_796_119_200_000;

    #[test]
    fn a_toml_sale_gets_its_start_now_and_its_end_from_its_duration() {
        let body = parse(
            "id = \"drop\"\nname = \"Drop\"\nstock = 5\nduration_seconds = 60\n",
            Format::Toml,
            "drop",
            NOW,
        )
        .unwrap();
        assert_eq!(
            body,
            json!({
                "name": "Drop", "stock": 5,
                "starts_at": "2026-12-01T10:00:00.000Z",
                "ends_at": "2026-12-01T10:01:00.000Z",
            })
        );
    }

    #[test]
    fn a_json_sale_passes_its_keys_as_they_are() {
        let text = r#"{"name": "D", "stock": 3, "per_user_limit": 2,
            "starts_at": "2026-12-01T10:00:00Z", "ends_at": "2026-12-01T11:00:00Z",
            "buckets": 4, "payment_timeout_seconds": 600, "draw_window_ms": 0,
            "checkout_url": "https://shop.example/pay/{reservation_id}"}"#;
        let body = parse(text, Format::Json, "d", NOW).unwrap();
        assert_eq!(
            body["checkout_url"],
            "https://shop.example/pay/{reservation_id}"
        );
        assert_eq!(body["ends_at"], "2026-12-01T11:00:00Z");
        assert_eq!(
            (body["per_user_limit"].as_i64(), body["buckets"].as_i64()),
            (Some(2), Some(4))
        );
        assert_eq!(body["payment_timeout_seconds"], 600);
    }

    #[test]
    fn a_bad_sale_file_names_its_key() {
        let cases = [
            ("name = \"x\"\nstock = 1\nstcok = 2\n", "stcok"),
            ("id = \"other\"\nname = \"x\"\nstock = 1\n", "id:"),
            (
                "name = \"x\"\nstock = 1\nends_at = \"2026-12-01T11:00:00Z\"\nduration_seconds = 5\n",
                "duration_seconds",
            ),
            ("name = \"x\"\nstock = 1\nstarts_at = \"soon\"\n", "starts_at"),
            ("name = \"x\"\n", "stock"),
        ];
        for (text, key) in cases {
            let err = parse(text, Format::Toml, "x", NOW).unwrap_err();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn the_format_follows_the_extension_or_the_first_character() {
        let dir = std::env::temp_dir().join(format!("fg-sale-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("sale");
        std::fs::write(&json, "{\"name\": \"j\", \"stock\": 1}").unwrap();
        assert_eq!(read(&json, "j", NOW).unwrap()["name"], "j");
        let toml = dir.join("sale.toml");
        std::fs::write(&toml, "name = \"t\"\nstock = 1\n").unwrap();
        assert_eq!(read(&toml, "t", NOW).unwrap()["name"], "t");
        let err = read(&dir.join("absent.toml"), "t", NOW).unwrap_err();
        assert!(err.to_string().contains("absent.toml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
