//! Bucketed sales (`buckets > 1`, see `flashgate_common::buckets`) in the
//! backend: installing the buckets at preheat, keeping each bucket's copy
//! of the definition (pause, window, name, limit) in step with the sale's,
//! the transit repair that completes transfers a gateway left half-done,
//! and ([`stock`]) the buckets' bases: an operator's stock change, and the
//! repair of Σ bases = the database's stock.
//!
//! A bucketed sale is installed only while the database holds no order
//! of it (a new sale): its buckets then agree with the database by
//! construction and are marked synced at once. A bucket whose Redis failed
//! over is re-synced on its own (`crate::fence`, its `bucketed` module).
//! The restore of a bucketed sale Redis lost with orders leaves it alone
//! (logged; its buys answer 503) rather than selling from books that may
//! be short.
//!
//! Preheat: the stock is split `stock / N`, the remainder one each to the
//! first buckets; `lua/preheat_bucket.lua` installs each absent bucket
//! (paused, its stream's `orders` group, and `synced` = its Redis's
//! replication id), then `lua/preheat.lua` installs the sale's own meta
//! with `buckets`, which is what makes gateways see the sale, and the
//! recorded pause is applied to the sale and every bucket. Pause, resume
//! and definition changes are written to the sale's meta and then to every
//! bucket's (`lua/bucket_meta.lua`); every restore pass copies the sale's
//! pause to its buckets again.
//!
//! Limits, each failing safe:
//! - a bucketed sale Redis lost is installed again only when every bucket
//!   and the sale's meta are absent and the sale has no order (late orders
//!   are then counted in their home bucket); otherwise (orders, or some
//!   buckets survived, including a restore that died half way) it is left
//!   absent, logged as an error, an admin change of it answers `409
//!   bucketed_sale_absent`, and the backend's start goes on;
//! - the bucket count never changes: `409 buckets_fixed` (checked under the
//!   row's hold; the upsert never changes a saved row's `buckets`, and
//!   `lua/update_sale.lua` refuses a count other than the one Redis
//!   holds); a `[[sales]]` entry whose `buckets` differs from the saved
//!   sale's stops the backend at start (`sales[i].buckets: ...`);
//! - a draw with buckets > 1 is refused by validation (the draw is one
//!   slot).

use flashgate_common::buckets::split_stock;
use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_common::sale::SaleSpec;
use flashgate_common::scripts::{BUCKET_META, PREHEAT_BUCKET};
use redis::aio::ConnectionLike;
use redis::RedisError;

pub mod stock;

/// Installs every bucket of `spec` that is absent, each with its share of
/// the stock, paused (the restore then applies the recorded pause to the
/// sale and every bucket, see [`copy_fields`]). Returns how many were
/// installed now. The sale's own meta is written after this, by the
/// caller: until then gateways do not know the sale, so nobody can buy
/// from a bucket installed by a restore that then died, and the next one
/// leaves it as it is.
///
/// # Errors
/// Redis failed; buckets installed stay, the next pass installs the rest.
pub async fn install<C: ConnectionLike + Send>(
    conn: &mut C,
    spec: &SaleSpec,
) -> Result<u32, RedisError> {
    let mut installed = 0;
    for (k, share) in split_stock(spec.stock, spec.buckets)
        .into_iter()
        .enumerate()
    {
        let k = k as u32;
        let keys = SaleKeys::bucket(&spec.id, k);
        let done: i64 = PREHEAT_BUCKET
            .key(&keys.meta)
            .key(&keys.remaining)
            .key(&keys.stream)
            .key(&keys.synced)
            .arg(&spec.name)
            .arg(share)
            .arg(spec.per_user_limit)
            .arg(spec.starts_at_ms)
            .arg(spec.ends_at_ms)
            .arg("1")
            .arg(k)
            .arg(spec.buckets)
            .arg(CONSUMER_GROUP)
            .invoke_async(conn)
            .await?;
        installed += u32::try_from(done).unwrap_or(0);
    }
    Ok(installed)
}

/// How many of the `buckets` buckets of sale `id` are in Redis (their
/// meta present).
///
/// # Errors
/// Redis failed.
pub async fn present<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
) -> Result<u32, RedisError> {
    let mut n = 0;
    for k in 0..buckets {
        let there: bool = redis::cmd("EXISTS")
            .arg(SaleKeys::bucket(id, k).meta)
            .query_async(conn)
            .await?;
        n += u32::from(there);
    }
    Ok(n)
}

pub use flashgate_common::keys::buckets_in_redis as in_redis;

/// Writes `fields` into the meta copy of every present bucket of `id`
/// (`buckets` of them): how a pause or a new window reaches the deduct on
/// each bucket. An absent bucket is left absent.
///
/// # Errors
/// Redis failed; the restore loop's next pass copies the pause again.
pub async fn copy_fields<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
    fields: &[(&str, String)],
) -> Result<(), RedisError> {
    for k in 0..buckets {
        copy_fields_to(conn, id, k, fields).await?;
    }
    Ok(())
}

/// Writes `fields` into the meta copy of bucket `k` of `id`, if present
/// (what the re-sync of one failed-over bucket does).
///
/// # Errors
/// Redis failed.
pub async fn copy_fields_to<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    k: u32,
    fields: &[(&str, String)],
) -> Result<(), RedisError> {
    let mut call = BUCKET_META.key(SaleKeys::bucket(id, k).meta);
    for (field, value) in fields {
        call.arg(*field).arg(value);
    }
    let _: i64 = call.invoke_async(conn).await?;
    Ok(())
}

/// Copies the sale's own pause (its meta's `paused`) to every bucket of
/// sale `id` whose copy differs, if it is bucketed: the one way a pause
/// reaches the buckets. The restore loop calls it every pass, so the
/// copies are read first (plain reads, one per bucket) and the script runs
/// only where one differs: none in the normal case.
///
/// # Errors
/// Redis failed.
pub async fn copy_pause<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
) -> Result<(), RedisError> {
    let buckets = in_redis(conn, id).await?;
    if buckets <= 1 {
        return Ok(());
    }
    let paused: Option<String> = redis::cmd("HGET")
        .arg(SaleKeys::new(id).meta)
        .arg("paused")
        .query_async(conn)
        .await?;
    let Some(paused) = paused else { return Ok(()) };
    for k in 0..buckets {
        let meta = SaleKeys::bucket(id, k).meta;
        let copy: Option<String> = redis::cmd("HGET")
            .arg(&meta)
            .arg("paused")
            .query_async(conn)
            .await?;
        if copy.is_some_and(|c| c != paused) {
            let _: i64 = BUCKET_META
                .key(meta)
                .arg("paused")
                .arg(&paused)
                .invoke_async(conn)
                .await?;
        }
    }
    Ok(())
}

/// The definition fields a bucket copies from `spec` (its stock share is
/// its own).
pub fn definition_fields(spec: &SaleSpec) -> Vec<(&'static str, String)> {
    vec![
        ("name", spec.name.clone()),
        ("per_user_limit", spec.per_user_limit.to_string()),
        ("starts_at_ms", spec.starts_at_ms.to_string()),
        ("ends_at_ms", spec.ends_at_ms.to_string()),
    ]
}

/// One pass of the transit repair over `sales`: completes every transfer
/// between buckets that a gateway left open for longer than
/// `flashgate_common::transfer::REPAIR_AFTER_MS` (see
/// `flashgate_common::transfer`), and keeps each bucket's pause equal to
/// the sale's. Returns how many transfers it completed; failures are
/// logged and retried next pass.
pub async fn repair_all<C: ConnectionLike + Send>(conn: &mut C, sales: &[SaleSpec]) -> u64 {
    let mut closed = 0;
    for spec in sales.iter().filter(|s| s.buckets > 1) {
        match flashgate_common::transfer::repair(
            conn,
            &spec.id,
            spec.buckets,
            flashgate_common::now_ms(),
        )
        .await
        {
            Ok(n) => closed += n,
            Err(error) => {
                tracing::warn!(%error, sale = %spec.id, "cannot repair the sale's transfers in transit yet")
            }
        }
        if let Err(error) = copy_pause(conn, &spec.id).await {
            tracing::warn!(%error, sale = %spec.id, "cannot copy the sale's pause to its buckets yet");
        }
    }
    closed
}

/// Live counters of a bucketed sale for the operator view: items left
/// (every bucket's plus those in transit), reservations, and stream
/// entries pending over every bucket's stream.
///
/// # Errors
/// Redis failed.
pub async fn counters<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
) -> Result<(i64, i64, i64), RedisError> {
    let left = flashgate_common::transfer::left(conn, id, buckets).await?;
    let (mut reservations, mut pending) = (0, 0);
    for k in 0..buckets {
        let keys = SaleKeys::bucket(id, k);
        let n: i64 = redis::cmd("HLEN")
            .arg(&keys.reservations)
            .query_async(conn)
            .await?;
        reservations += n;
        pending += flashgate_common::stream_info::pending(conn, &keys.stream).await?;
    }
    Ok((left, reservations, pending))
}
