//! Operators' pauses of one sale and the global switch that stops them all.
//!
//! The database row is the truth of a sale's pause, and the `settings`
//! table the truth of the global switch; Redis holds a copy of both, which
//! the deduct script reads. Operators' changes write the database first,
//! then Redis: whatever Redis loses afterwards, the database already has.
//! Every pass of the restore loop then brings Redis's copies in line with
//! the database ([`sync_switch`], [`sync_pauses`]), so a Redis write that
//! failed or lost a race is corrected within `backend.restore_poll_ms`. A
//! switch the database never recorded (a database made by a version that
//! kept them only in Redis) is taken from Redis once.

use flashgate_common::keys::{switch_value, SaleEvent, SaleKeys, GLOBAL_SWITCH, SALES_INDEX};
use flashgate_common::now_ms;
use flashgate_common::sale::SaleSpec;
use flashgate_common::scripts::{PAUSE, PAUSE_SWAP, SWITCH_SWAP};
use redis::aio::ConnectionLike;
use redis::RedisError;

use crate::error::SaleError;
use crate::redis_io::announce;
use crate::store::Store;

/// Where an operator's pause or resume of a sale took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// Recorded and applied to the live sale.
    Applied,
    /// Recorded; the sale is not in Redis right now, and its restore
    /// applies the recorded value before anyone can buy.
    Recorded,
    /// No such sale.
    Unknown,
}

/// Pauses or resumes one sale: the deduct script refuses buys of a paused
/// sale, and gateways are told to drop their cached window at once. The
/// database is written first, so a Redis that loses the sale afterwards
/// gets it back paused.
///
/// # Errors
/// The database or Redis failed. After a Redis failure the database holds
/// the new value and the restore loop writes it into Redis within a pass
/// (see [`sync_pauses`]).
pub async fn set_paused<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    id: &str,
    paused: bool,
) -> Result<Paused, SaleError> {
    if !store.sales().set_paused(id, paused).await? {
        return Ok(Paused::Unknown);
    }
    Ok(if apply_pause(conn, id, paused).await? {
        Paused::Applied
    } else {
        Paused::Recorded
    })
}

/// Writes a sale's pause into Redis, only if the sale is there (never
/// creates a half sale); returns whether it was.
///
/// # Errors
/// Redis failed.
async fn apply_pause<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    paused: bool,
) -> Result<bool, RedisError> {
    let keys = SaleKeys::new(id);
    let existed: i64 = PAUSE
        .key(&keys.meta)
        .arg(if paused { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    if existed == 1 {
        crate::buckets::copy_pause(conn, id).await?;
        announce(conn, &SaleEvent::Changed(id.to_owned())).await;
    }
    Ok(existed == 1)
}

/// Turns the global switch: `paused` stops every buy on every gateway.
/// Written to the database first, then to Redis.
///
/// # Errors
/// The database or Redis failed. After a Redis failure the database holds
/// the new value and the restore loop writes it into Redis within a pass
/// (see [`sync_switch`]).
pub async fn set_all_paused<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    paused: bool,
) -> Result<(), SaleError> {
    store.switch().set_paused(paused).await?;
    let () = redis::cmd("SET")
        .arg(GLOBAL_SWITCH)
        .arg(switch_value(paused))
        .query_async(conn)
        .await?;
    announce(conn, &SaleEvent::AllPaused(paused)).await;
    Ok(())
}

/// Sets sale `id`'s pause in Redis to `paused` if it still holds `seen`
/// (read before the database was) and no other restore holds the sale
/// (`token`: the caller's restore lock, or empty); gateways are told at
/// once. Returns whether it was set.
///
/// # Errors
/// Redis failed.
pub async fn swap_pause<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    seen: &str,
    paused: bool,
    token: &str,
) -> Result<bool, RedisError> {
    let keys = SaleKeys::new(id);
    let want = if paused { "1" } else { "0" };
    let set: i64 = PAUSE_SWAP
        .key(&keys.meta)
        .key(&keys.restoring)
        .arg(seen)
        .arg(want)
        .arg(token)
        .invoke_async(conn)
        .await?;
    if set == 1 {
        crate::buckets::copy_pause(conn, id).await?;
        announce(conn, &SaleEvent::Changed(id.to_owned())).await;
    }
    Ok(set == 1)
}

/// Brings the global switch in Redis (`fg:switch`) in line with the
/// database, which is the truth: writes it when Redis lost it or holds
/// another value (a Redis write that failed after the database write, two
/// operators racing). A switch the database never recorded (a database
/// made before it kept the switch) is taken from Redis instead, so an
/// upgrade keeps a paused shop paused; with neither, the switch is open.
///
/// # Errors
/// The database or Redis failed.
pub async fn sync_switch<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
) -> Result<(), SaleError> {
    let current: Option<String> = redis::cmd("GET")
        .arg(GLOBAL_SWITCH)
        .query_async(conn)
        .await?;
    let paused = match (store.switch().paused().await?, current.as_deref()) {
        (Some(recorded), _) => recorded,
        (None, Some(found)) => {
            store.switch().adopt_paused(found == "paused").await?;
            tracing::info!(
                switch = found,
                "global switch taken from redis into the database, which had none"
            );
            return Ok(());
        }
        (None, None) => false,
    };
    let want = switch_value(paused);
    if current.as_deref() == Some(want) {
        return Ok(());
    }
    let written = match &current {
        None => redis::cmd("SET")
            .arg(GLOBAL_SWITCH)
            .arg(want)
            .arg("NX")
            .query_async::<Option<String>>(conn)
            .await?
            .is_some(),
        Some(seen) => {
            SWITCH_SWAP
                .key(GLOBAL_SWITCH)
                .arg(seen)
                .arg(want)
                .invoke_async::<i64>(conn)
                .await?
                == 1
        }
    };
    if written {
        tracing::warn!(paused, was = ?current, "global switch in redis differed from the database; set from the database");
        announce(conn, &SaleEvent::AllPaused(paused)).await;
    }
    Ok(())
}

/// Puts the recorded global switch back into a Redis that lost it (`SET
/// NX`), before a restore makes any sale buyable; open when the database
/// never recorded one. Never writes the database (a restore may run inside
/// an operator's uncommitted sale write); [`sync_switch`] does the rest.
///
/// # Errors
/// The database or Redis failed.
pub async fn restore_switch<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
) -> Result<(), SaleError> {
    let paused = store.switch().paused().await?.unwrap_or(false);
    let written: Option<String> = redis::cmd("SET")
        .arg(GLOBAL_SWITCH)
        .arg(switch_value(paused))
        .arg("NX")
        .query_async(conn)
        .await?;
    if written.is_some() {
        tracing::warn!(
            paused,
            "global switch was missing from redis; restored from the database"
        );
        announce(conn, &SaleEvent::AllPaused(paused)).await;
    }
    Ok(())
}

/// Redis commands per pipeline while syncing pauses.
const SYNC_CHUNK: usize = 500;

/// Brings every sale present in Redis in line with the database: its pause
/// (`meta.paused`, the database is the truth; a pause the database never
/// recorded is taken from Redis, as in [`sync_switch`]), and its place in
/// the sales index gateways and consumers read (`fg:sales`; a sale whose
/// window has ended is left to whatever removed it). A sale being restored
/// is skipped: its restore applies the recorded pause itself.
///
/// # Errors
/// The database or Redis failed.
pub async fn sync_pauses<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sales: &[SaleSpec],
) -> Result<(), SaleError> {
    // Redis first, then the database: a value compared and swapped below
    // was read before the database, so an operator's change made after that
    // read either is in what the database answered or makes the swap fail.
    let mut seen: Vec<(Option<String>, bool)> = Vec::with_capacity(sales.len());
    for chunk in sales.chunks(SYNC_CHUNK) {
        let mut pipe = redis::pipe();
        for spec in chunk {
            let keys = SaleKeys::new(&spec.id);
            pipe.hget(&keys.meta, "paused").exists(&keys.restoring);
        }
        seen.extend(
            pipe.query_async::<Vec<(Option<String>, bool)>>(conn)
                .await?,
        );
    }
    let recorded: std::collections::HashMap<String, Option<bool>> =
        store.sales().pauses().await?.into_iter().collect();
    let now = now_ms();
    let mut listed = Vec::new();
    for (spec, (paused, restoring)) in sales.iter().zip(seen) {
        // Absent (the restore loads it) or being restored (the restore
        // applies the recorded pause itself).
        let Some(paused) = paused else { continue };
        if restoring {
            continue;
        }
        if spec.ends_at_ms > now {
            listed.push(spec.id.as_str());
        }
        match recorded.get(&spec.id).copied().flatten() {
            None => {
                if store.sales().adopt_paused(&spec.id, paused == "1").await? {
                    tracing::info!(sale = %spec.id, paused, "sale pause taken from redis into the database, which had none");
                }
            }
            Some(want) => {
                let want = if want { "1" } else { "0" };
                if paused == want {
                    continue;
                }
                if swap_pause(conn, &spec.id, &paused, want == "1", "").await? {
                    tracing::warn!(sale = %spec.id, was = %paused, now = want, "sale pause in redis differed from the database; set from the database");
                }
            }
        }
    }
    for chunk in listed.chunks(SYNC_CHUNK) {
        let () = redis::cmd("SADD")
            .arg(SALES_INDEX)
            .arg(chunk)
            .query_async(conn)
            .await?;
    }
    Ok(())
}
