//! What each gateway knows about its sales: one [`SaleCache`] per gateway,
//! from which the buy path's window checks, `GET /api/sales/{id}` and
//! `GET /api/sales` are all answered.
//!
//! - **One snapshot per sale** ([`SaleSnapshot`]): the meta hash and the
//!   remaining stock, read in one pipelined round trip. A buy accepts a
//!   snapshot up to [`WINDOW_TTL`] old and answers requests before the start,
//!   after the end or while paused from it; a view accepts one up to
//!   `pages.state_ttl_ms` old (about a quarter of a second: sale pages poll
//!   every second or two, and remaining stock is never older than that).
//!   A refresh is single-flight (moka's `try_get_with`): any number of
//!   readers cost at most one Redis read per sale per TTL per gateway. An
//!   unknown sale is cached too; a Redis error is not. This gateway's own
//!   wins (and a sold-out answer) are applied to the held snapshot at once,
//!   so a buyer's next view shows their item gone.
//! - **The sold-out flag**: set when the deduct script answers sold out,
//!   here or on another gateway (announced on the events channel). While it
//!   is set, buys get `410 sold_out` without running the script. An
//!   operator's change to the sale, or items of cancelled orders going back
//!   to its stock, clears it everywhere (the backend announces both as
//!   "changed", which also drops the snapshot). It also expires after
//!   [`SOLD_OUT_TTL`], so a missed "changed" event costs one script call per
//!   gateway per TTL, never a sale that stays closed. The flag comes from
//!   the script and the events channel, not from the meta hash, so it lives
//!   beside the snapshot with its own TTL.
//! - **The users who ever won in a sold-out sale**
//!   ([`SaleCache::ever_won`]): only they can have a won Idempotency-Key to
//!   replay, so only their keyed buys read that key's outcome from Redis.
//!   Read once per sale per sold-out flag.
//! - **Whether a sale missing from Redis exists in the backend's database**
//!   ([`SaleCache::missing`]): if it does, Redis lost it and the backend is
//!   restoring it. The answer is cached for [`MISSING_TTL`], so a flood of
//!   buys costs one backend call per sale per TTL.
//!
//! Everything is bounded (moka caches of at most 10,000 sales) and
//! answers domain values; the HTTP answer is decided by the caller.

mod cache;
mod snapshot;

pub use cache::{MissingSale, SaleCache, MISSING_TTL, SOLD_OUT_TTL, WINDOW_TTL};
pub use snapshot::{parse, read_snapshot, SaleSnapshot, SaleSummary, SaleView, SaleWindow, WindowCheck};
