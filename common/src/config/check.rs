//! The validation helper: every check names its key and writes its message
//! from the bound it enforces, so a bound and its message cannot drift
//! apart, and every problem is collected rather than only the first (an
//! operator fixes a file in one pass).
//!
//! Messages read `key: must be between 1 and 60000, got 0`; a note explains
//! a bound where the number alone would not (`(0 = never)`).

use std::fmt::Display;
use std::num::NonZeroU32;

/// The problems found so far, each prefixed with its key path.
#[derive(Debug, Default)]
pub struct Check {
    problems: Vec<String>,
}

/// The result of one check, to which a note about the bound can be added.
pub struct Checked<'a> {
    /// The message of the failed check, if it failed, and where in it the
    /// bound ends (the note goes there, before `, got ...`).
    failed: Option<(&'a mut String, usize)>,
}

impl Checked<'_> {
    /// Adds `(note)` after the bound in the message, if the check failed.
    pub fn note(self, note: &str) {
        if let Some((message, at)) = self.failed {
            message.insert_str(at, &format!(" ({note})"));
        }
    }

    /// Whether the value passed.
    pub fn ok(&self) -> bool {
        self.failed.is_none()
    }
}

impl Check {
    /// Records a problem at `key`, described by `why`.
    pub fn fail(&mut self, key: impl Display, why: impl Display) {
        self.problems.push(format!("{key}: {why}"));
    }

    /// Records a problem whose message already names its key (e.g. from a
    /// rule shared with the admin API, prefixed with the path to it).
    pub fn problem(&mut self, message: impl Display) {
        self.problems.push(message.to_string());
    }

    /// `requirement` (e.g. `must be an http:// URL`) holds when `ok`.
    pub fn that(&mut self, ok: bool, key: impl Display, requirement: impl Display) -> Checked<'_> {
        if ok {
            return Checked { failed: None };
        }
        self.record(format!("{key}: {requirement}"), None::<u8>)
    }

    /// `min <= value <= max`.
    pub fn between<T: PartialOrd + Display>(
        &mut self,
        key: impl Display,
        value: T,
        min: T,
        max: T,
    ) -> Checked<'_> {
        if min <= value && value <= max {
            return Checked { failed: None };
        }
        self.record(
            format!("{key}: must be between {min} and {max}"),
            Some(value),
        )
    }

    /// `value <= max`.
    pub fn at_most<T: PartialOrd + Display>(
        &mut self,
        key: impl Display,
        value: T,
        max: T,
    ) -> Checked<'_> {
        if value <= max {
            return Checked { failed: None };
        }
        self.record(format!("{key}: must be at most {max}"), Some(value))
    }

    /// `1 <= value <= max`, as the non-zero value the settings keep.
    pub fn non_zero(
        &mut self,
        key: impl Display,
        value: u32,
        max: u32,
        note: &str,
    ) -> Option<NonZeroU32> {
        let checked = self.between(key, value, 1, max);
        let ok = checked.ok();
        checked.note(note);
        NonZeroU32::new(value).filter(|_| ok)
    }

    /// The problems, or `Ok` when there were none.
    ///
    /// # Errors
    /// Every problem recorded, in the order found.
    pub fn finish(self) -> Result<(), Vec<String>> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self.problems)
        }
    }

    fn record(&mut self, bound: String, got: Option<impl Display>) -> Checked<'_> {
        let at = bound.len();
        let message = match got {
            Some(value) => format!("{bound}, got {value}"),
            None => bound,
        };
        self.problems.push(message);
        Checked {
            failed: self.problems.last_mut().map(|m| (m, at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Check;

    #[test]
    fn the_message_is_written_from_the_key_and_the_bound() {
        let mut check = Check::default();
        check.between("limits.buy.user.burst", 0, 1, 10_000_000);
        check
            .at_most("pages.reload_interval_ms", 4_000_000u64, 3_600_000)
            .note("0 turns reloading off");
        check.between("redis.timeout_ms", 0u64, 1, 60_000);
        check
            .that(false, "redis.url", "must start with redis:// or rediss://")
            .note("TLS: rediss://");
        check.fail("sales[0].id", "`a` is declared twice");
        assert_eq!(
            check.finish().unwrap_err(),
            [
                "limits.buy.user.burst: must be between 1 and 10000000, got 0",
                "pages.reload_interval_ms: must be at most 3600000 (0 turns reloading off), got 4000000",
                "redis.timeout_ms: must be between 1 and 60000, got 0",
                "redis.url: must start with redis:// or rediss:// (TLS: rediss://)",
                "sales[0].id: `a` is declared twice",
            ]
        );
    }

    #[test]
    fn passing_checks_record_nothing_and_notes_on_them_are_dropped() {
        let mut check = Check::default();
        check.between("a", 1, 1, 1).note("unused");
        check.between("b", 5, 1, 9);
        check.at_most("c", 5, 5);
        check.that(true, "d", "must hold");
        assert_eq!(
            check.non_zero("e", 3, 10, "n"),
            std::num::NonZeroU32::new(3)
        );
        assert!(check.finish().is_ok());
    }

    #[test]
    fn a_zero_or_too_large_non_zero_value_is_refused_with_its_key() {
        let mut check = Check::default();
        assert_eq!(
            check.non_zero(
                "limits.read.ip.per_second",
                0,
                10,
                "leave the bucket out for no limit"
            ),
            None
        );
        assert_eq!(
            check.non_zero(
                "limits.read.ip.burst",
                11,
                10,
                "leave the bucket out for no limit"
            ),
            None
        );
        assert_eq!(
            check.finish().unwrap_err(),
            [
                "limits.read.ip.per_second: must be between 1 and 10 (leave the bucket out for no limit), got 0",
                "limits.read.ip.burst: must be between 1 and 10 (leave the bucket out for no limit), got 11",
            ]
        );
    }
}
