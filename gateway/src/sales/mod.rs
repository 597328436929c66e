//! The sales layer: what each gateway knows about its sales. It exports
//! the [`SaleCache`] (one per gateway, from which the buy path's window
//! checks, `GET /flashgate/api/sales/{id}` and `GET /flashgate/api/sales` are all answered)
//! and its values, the pause [`Switches`] and their watcher, and the
//! [`EventListener`] that applies other gateways' sale events.
//!
//! - **One snapshot per sale** ([`SaleSnapshot`]): the meta hash and the
//!   remaining stock, read in one pipelined round trip. A buy accepts a
//!   snapshot up to [`WINDOW_TTL`] old and answers requests before the start,
//!   after the end or while paused from it; a view accepts one up to
//!   `pages.state_ttl_ms` old (about a quarter of a second: sale pages poll
//!   every second or two, and remaining stock is never older than that).
//!   A refresh is single-flight (readers queue on the sale's entry): any
//!   number of readers cost at most one Redis read per sale per TTL per
//!   gateway. An unknown sale is cached too; a Redis error is not. This gateway's own
//!   wins (and a sold-out answer) are applied to the held snapshot at once,
//!   so a buyer's next view shows their item gone.
//! - **The sold-out flag**: set when the deduct script answers sold out,
//!   here or on another gateway (announced on the events channel). While it
//!   is set, buys without an Idempotency-Key get `410 sold_out` without
//!   running the script; a keyed buy is always decided (and its answer
//!   remembered) by Redis, so a flag that may be stale never gives a key
//!   its final answer. An operator's change to the sale, or items of
//!   cancelled orders going back to its stock, clears it everywhere (the
//!   backend announces both as "changed", which also drops the snapshot).
//!   It also expires after [`SOLD_OUT_TTL`], and every flag is cleared when
//!   the events subscription is (re-)established, so a missed "changed"
//!   event costs script calls, never a sale that stays closed.
//! - **The stock epoch**: Redis counts up a sale's epoch (`epoch` in its
//!   meta, `lua/lib/epoch.lua`) whenever items can come back (returns,
//!   restocks, re-syncs, restores: `lua/release.lua`, `lua/update_sale.lua`,
//!   `lua/resync.lua`, `lua/preheat.lua`), and a fresh `sold_out` carries
//!   the epoch it was decided at (so does its `sold_out:ID:eEPOCH` event).
//!   On a "changed" event each gateway reads the new epoch; a `sold_out`
//!   older than the newest epoch known (an answer decided just before items
//!   came back, handled or announced after) flags nothing, here or
//!   anywhere. A clear whose epoch is unknown (its read failed, the
//!   subscription re-established) is *blind*: a deduct sent before it flags
//!   nothing, and announced ones flag nothing until the epoch is known
//!   again ([`Clears`]).
//! - **A bucketed sale's flag** is local only: set once this gateway
//!   confirmed every bucket dry (`buy::refill`), never announced, and
//!   judged by every clear since the confirmation began; its epoch plays no
//!   part. Per-bucket empty flags (announced as `sold_out:ID:bK`, cleared
//!   by `stocked:ID:bK`) only order the donors of a refill.
//! - **Whether a sale missing from Redis exists in the backend's database**
//!   ([`SaleCache::missing`]): if it does, Redis lost it and the backend is
//!   restoring it. The answer is cached for [`MISSING_TTL`], so a flood of
//!   buys costs one backend call per sale per TTL.
//!
//! All a gateway holds of one sale (snapshot, flag, epoch and clears,
//! bucket hints and count) is one entry of one map of at most 10,000
//! sales (`map`: a lock-free read, since a buy reads its entry several
//! times; at the bound, entries that hold nothing go first). Ids Redis
//! does not have, and the backend's word on them, live in two small
//! caches of their own with short lifetimes, and an entry made for an id
//! Redis does not have is dropped after its read: made-up ids do not stay
//! in the map.
//! Everything answers domain values; the HTTP answer is decided by the
//! caller.

mod cache;
mod events;
mod map;
mod snapshot;
mod switches;

pub use cache::{
    Clears, MissingSale, SaleCache, BUYERS_READ_INTERVAL, BUYERS_TTL, MISSING_TTL, SOLD_OUT_TTL,
    WINDOW_TTL,
};
pub use events::{AnnouncedPurges, EventListener};
pub use snapshot::{
    parse, read_snapshot, read_stock_epoch, SaleSnapshot, SaleSummary, SaleView, SaleWindow,
    WindowCheck,
};
pub use switches::{SwitchWatcher, Switches};
