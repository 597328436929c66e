//! A sale's definition and the state buyers see.

use serde::{Deserialize, Serialize};

/// Longest sale id accepted anywhere (URLs, config, admin API).
pub const MAX_SALE_ID_LEN: usize = 64;

/// Sale ids are 1 to 64 characters of `[A-Za-z0-9_-]`: they appear in URLs,
/// Redis keys and reservation ids, so nothing there needs escaping.
pub fn valid_sale_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SALE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Payment timeout of a sale when its declaration leaves it out.
pub const DEFAULT_PAYMENT_TIMEOUT_SECONDS: i64 = 900;
/// Longest payment timeout accepted: a week.
pub const MAX_PAYMENT_TIMEOUT_SECONDS: i64 = 7 * 86_400;

/// Validates a payment timeout in seconds (1 s to a week), naming the key.
pub fn payment_timeout(seconds: i64) -> Result<std::time::Duration, String> {
    if (1..=MAX_PAYMENT_TIMEOUT_SECONDS).contains(&seconds) {
        Ok(std::time::Duration::from_secs(seconds as u64))
    } else {
        Err(format!(
            "payment_timeout_seconds: must be between 1 and {MAX_PAYMENT_TIMEOUT_SECONDS}"
        ))
    }
}

/// Longest draw window: a minute. Buyers wait the window out, so more is
/// a typo, not a policy.
pub const MAX_DRAW_WINDOW_MS: i64 = 60_000;

/// Validates an opening draw window (`crate::draw`) in milliseconds (0 = no draw), naming `key`.
///
/// # Errors
/// The value is negative or above [`MAX_DRAW_WINDOW_MS`].
pub fn draw_window_ms(key: &str, value: i64) -> Result<u64, String> {
    if (0..=MAX_DRAW_WINDOW_MS).contains(&value) {
        Ok(value as u64)
    } else {
        Err(format!(
            "{key}: must be between 0 and {MAX_DRAW_WINDOW_MS} (0 = no draw)"
        ))
    }
}

/// What an operator declares: the immutable facts of a sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleSpec {
    pub id: String,
    pub name: String,
    pub stock: i64,
    pub per_user_limit: i64,
    pub starts_at_ms: i64,
    pub ends_at_ms: i64,
    /// The sale's own opening draw window, ms (0 = no draw); `None`
    /// follows `[fairness] window_ms` (see [`crate::draw`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw_window_ms: Option<i64>,
    /// How many buckets the stock is split over (1 to 64; see
    /// [`crate::buckets`]). 1, the default, keeps the one-slot layout.
    #[serde(default = "one_bucket")]
    pub buckets: u32,
    /// Where winners pay: a URL template (see [`crate::checkout`]);
    /// `None`: no checkout hand-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout_url: Option<String>,
}

fn one_bucket() -> u32 {
    1
}

impl SaleSpec {
    /// Checks the invariants every sale must hold, naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !valid_sale_id(&self.id) {
            return Err("id: must be 1 to 64 characters of A-Z a-z 0-9 _ -".into());
        }
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return Err("name: must be 1 to 200 characters".into());
        }
        if self.stock < 0 || self.stock > 1_000_000_000 {
            return Err("stock: must be between 0 and 1000000000".into());
        }
        if self.per_user_limit < 1 || self.per_user_limit > 1_000_000 {
            return Err("per_user_limit: must be between 1 and 1000000".into());
        }
        if self.ends_at_ms <= self.starts_at_ms {
            return Err("ends_at: must be after starts_at".into());
        }
        if let Some(w) = self.draw_window_ms {
            draw_window_ms("draw_window_ms", w)?;
        }
        crate::buckets::validate("buckets", i64::from(self.buckets))?;
        if self.buckets > 1 && self.draw_window_ms.is_some_and(|w| w != 0) {
            return Err("buckets: must be 1 for a sale with a draw window (draw_window_ms): the draw runs in one slot".into());
        }
        if let Some(url) = &self.checkout_url {
            crate::checkout::validate(url)?;
        }
        Ok(())
    }
}

/// The state of a sale as a buyer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaleState {
    Upcoming,
    Open,
    SoldOut,
    Ended,
    Paused,
}

impl SaleState {
    /// Derives the state from the window, the pause flag and the stock left.
    /// Ended wins over sold out: a finished sale is over whatever is left.
    pub fn at(now_ms: i64, spec: &SaleSpec, paused: bool, remaining: i64) -> Self {
        if now_ms >= spec.ends_at_ms {
            SaleState::Ended
        } else if paused {
            SaleState::Paused
        } else if now_ms < spec.starts_at_ms {
            SaleState::Upcoming
        } else if remaining <= 0 {
            SaleState::SoldOut
        } else {
            SaleState::Open
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SaleSpec {
        SaleSpec {
            id: "s".into(),
            name: "n".into(),
            stock: 10,
            per_user_limit: 1,
            starts_at_ms: 100,
            ends_at_ms: 200,
            draw_window_ms: None,
            buckets: 1,
            checkout_url: None,
        }
    }

    #[test]
    fn state_follows_window_pause_and_stock() {
        let s = spec();
        assert_eq!(SaleState::at(99, &s, false, 10), SaleState::Upcoming);
        assert_eq!(SaleState::at(100, &s, false, 10), SaleState::Open);
        assert_eq!(SaleState::at(150, &s, false, 0), SaleState::SoldOut);
        assert_eq!(SaleState::at(150, &s, true, 10), SaleState::Paused);
        assert_eq!(SaleState::at(200, &s, false, 10), SaleState::Ended);
    }

    #[test]
    fn validation_names_the_bad_field() {
        let mut s = spec();
        s.ends_at_ms = 50;
        assert!(s.validate().unwrap_err().starts_with("ends_at"));
        let mut s = spec();
        s.id = "bad id".into();
        assert!(s.validate().unwrap_err().starts_with("id"));
        let mut s = spec();
        s.draw_window_ms = Some(-1);
        assert!(s.validate().unwrap_err().starts_with("draw_window_ms"));
        let mut s = spec();
        s.buckets = 65;
        assert!(s.validate().unwrap_err().starts_with("buckets"));
        s.buckets = 4;
        assert!(s.validate().is_ok());
        s.draw_window_ms = Some(100);
        assert!(
            s.validate().unwrap_err().starts_with("buckets"),
            "a draw is one slot"
        );
        assert!(spec().validate().is_ok());
        let mut s = spec();
        s.checkout_url = Some("https://shop/{nope}".into());
        assert!(s.validate().unwrap_err().starts_with("checkout_url"));
    }

    #[test]
    fn sale_ids_are_url_and_key_safe() {
        assert!(valid_sale_id("summer-drop_2026"));
        assert!(!valid_sale_id(""));
        assert!(!valid_sale_id("a/b"));
        assert!(!valid_sale_id("a:b"));
        assert!(!valid_sale_id(&"x".repeat(65)));
    }
}
