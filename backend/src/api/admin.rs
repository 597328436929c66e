//! The admin API: operators create and change sales and watch their
//! counters. Every route requires `Authorization: Bearer <token>`
//! (checked by [`super::auth`]).
//!
//! A change must agree in Redis (where the gateway sells) and in the
//! database (the truth that survives Redis). The database write is opened
//! in a transaction that holds the sale's row, Redis is updated, and only
//! then is the transaction committed; when Redis refuses (new stock below
//! what is sold) the transaction is dropped, so neither side changes.
//!
//! Redis never sells more than the database holds, whatever fails or dies
//! between the two steps: a stock decrease is made in Redis before the
//! commit, an increase only after it, under a new hold of the row
//! ([`raise_after_commit`]); a crash in between leaves too few items in
//! Redis, which reconciliation adds back. The same for a sale of one
//! bucket (its stock in Redis) and a bucketed one (its buckets' bases,
//! `crate::buckets::stock`). Gateways are told (`changed:ID`) only after
//! the commit. A failed commit puts back what the database holds
//! ([`after_failed_commit`]); a refusal to do so is logged and counted.
//!
//! **Stock change**, in order ([`put`]):
//! 1. under the exclusive hold of the sale's row that every change takes
//!    (`SaleWrite::held`, the lock a re-sync takes too: no order of the
//!    sale commits, no re-sync or repair runs meanwhile), the stock Redis
//!    sells from (a sale's own, or the buckets' bases) is read from Redis,
//!    whether or not the database has the row yet (a create whose commit
//!    failed left the sale in Redis). It moves only when the stock changed,
//!    or when items are missing (a raise whose last step died is completed
//!    by sending it again); a rename or a window change never takes items,
//!    so never answers 409. The target is the new stock, not a difference,
//!    so sending a change again never applies it twice. A raise of a fenced
//!    sale answers `503 sale_fenced` (a fenced bucket: `503 unavailable`)
//!    with nothing changed;
//! 2. a decrease: `lua/update_sale.lua` with the new definition for a sale
//!    of one bucket, atomically refused (`409 stock_below_sold`) below the
//!    items sold, or (`503 sale_fenced`) while fenced; for a bucketed sale,
//!    unsold items only are taken from the buckets
//!    (`crate::buckets::stock`), and when they hold too few, what was taken
//!    goes back and the answer is the same 409. A raise writes the new
//!    definition with the stock Redis has (raised in step 5);
//! 3. a bucketed sale: the sale's own meta (`lua/update_sale.lua` writes
//!    only its definition, its own `remaining` stays 0) and each bucket's
//!    copy of the definition. A failure here moves a decrease back;
//! 4. the database commit. If it fails (or its answer is lost: it may have
//!    happened), the row is held again, the sale re-read as committed, and
//!    that definition and stock put back in Redis, never the old stock
//!    blindly (`after_failed_commit`); then `changed:ID` is published;
//! 5. an increase, after the commit, under the row's hold again
//!    (`raise_after_commit`): the committed stock is re-read and Redis
//!    moved to it (a bucketed sale's Δ spread like a preheat, each bucket
//!    that gained announced `stocked:ID:bK`), then `changed:ID` is
//!    published. A failure here answers 503 (the stock is saved, its new
//!    items are not in Redis yet): sending the change again, or
//!    reconciliation (or, for a sale fenced meanwhile, its re-sync), adds
//!    them.
//!
//! A process that dies during 2 or between 4 and 5 leaves Redis's stock
//! below the database's: no item is created or lost by that alone, and
//! reconciliation adds the missing items unless the operator sends the
//! change again first.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::keys::SaleEvent;
use flashgate_common::sale::{valid_sale_id, SaleSpec};
use prometheus::IntCounter;
use serde::Deserialize;

use super::error::{parse_json, ApiError};
use super::AppState;
use crate::buckets::stock;
use crate::redis_io::announce;
use crate::sales::{self, Applied, SaleView};
use crate::store::Store;
use crate::stream::dead_letter;
use crate::switches;

/// Body of `PUT /admin/sales/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaleBody {
    pub name: String,
    pub stock: i64,
    #[serde(default = "one")]
    pub per_user_limit: i64,
    /// RFC 3339.
    pub starts_at: String,
    /// RFC 3339.
    pub ends_at: String,
    /// Unpaid orders are cancelled this long after their reservation;
    /// left out, a new sale gets 900 and a changed one keeps its own.
    #[serde(default)]
    pub payment_timeout_seconds: Option<i64>,
    /// The sale's own opening draw window, ms (0 = no draw); left out,
    /// the sale follows `[fairness] window_ms`.
    #[serde(default)]
    pub draw_window_ms: Option<i64>,
    /// How many buckets the stock is split over (1 to 64; see
    /// `flashgate_common::buckets`); left out, 1.
    #[serde(default = "one")]
    pub buckets: i64,
    /// Where winners pay: a URL template (docs/CHECKOUT.md); left out or
    /// null, no checkout hand-off.
    #[serde(default)]
    pub checkout_url: Option<String>,
}

fn one() -> i64 {
    1
}

fn parse_time(field: &str, value: &str) -> Result<i64, ApiError> {
    flashgate_common::parse_rfc3339(field, value).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn sale_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path?;
    if valid_sale_id(&id) {
        Ok(id)
    } else {
        Err(ApiError::bad_request(
            "id: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
        ))
    }
}

/// `PUT /admin/sales/{id}`: 201 when the sale is new, 200 when it changed,
/// 409 `stock_below_sold` when the new stock is below the items sold (for
/// a bucketed sale: more than the unsold items its buckets hold, items in
/// transit counting as sold), 503 when Redis failed (sending the same
/// change again is safe: a bucketed sale's bases are moved to the stock
/// sent, not by a difference; a raised stock whose items did not reach the
/// buckets is completed by the resend or by reconciliation).
pub async fn put(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = sale_id(id)?;
    let body: SaleBody = parse_json(&body?)?;
    let spec = SaleSpec {
        id,
        name: body.name,
        stock: body.stock,
        per_user_limit: body.per_user_limit,
        starts_at_ms: parse_time("starts_at", &body.starts_at)?,
        ends_at_ms: parse_time("ends_at", &body.ends_at)?,
        draw_window_ms: body.draw_window_ms,
        buckets: flashgate_common::buckets::validate("buckets", body.buckets)
            .map_err(ApiError::bad_request)?,
        checkout_url: body.checkout_url,
    };
    spec.validate().map_err(ApiError::bad_request)?;
    // Draws are not offered on Redis Cluster (docs/RELIABILITY.md, known gaps).
    if state.redis.is_cluster() && spec.draw_window_ms.is_some_and(|w| w != 0) {
        return Err(ApiError::bad_request(
            "draw_window_ms: must be 0 with redis.mode = \"cluster\" (no draws on Redis Cluster)",
        ));
    }
    if let Some(t) = body.payment_timeout_seconds {
        flashgate_common::sale::payment_timeout(t).map_err(ApiError::bad_request)?;
    }

    let _one_writer = state.sale_writes.lock().await;
    let mut write = state.store.sales().begin_write().await?;
    // Read under the row's hold: no other writer can change it before the
    // commit (the count gateways use must be the one saved).
    let previous = write.held(&spec.id).await?;
    if let Some(old) = &previous {
        bucket_change(old, &spec)?;
    }
    write.upsert(&spec).await?;
    if let Some(t) = body.payment_timeout_seconds {
        write.set_payment_timeout(&spec.id, t).await?;
    }
    let mut redis = state.redis.clone();
    // A changed window may reopen a finished sale: it is made live before
    // Redis sells by the new window, so a consumer always reads what it
    // sells, whatever fails or dies after this point.
    if let Err(error) = crate::stream::retention::unarchive(&mut redis, &spec.id).await {
        tracing::warn!(%error, sale = %spec.id, "cannot unarchive the sale before changing it");
        return Err(ApiError::unavailable(
            "redis failed before the change; nothing was changed, send it again",
        ));
    }
    // The stock Redis sells from (a bucketed sale's buckets' bases, a sale
    // of one bucket its own stock), as Redis holds it, whether or not the
    // database has the row yet: a decrease moves it before the commit,
    // under the row's hold, so a crash leaves too few items (reconciliation
    // adds them back); an increase moves it only after the commit
    // ("Stock change" in the module doc).
    let held = if spec.buckets > 1 {
        None
    } else {
        sales::stock_in_redis(&mut redis, &spec.id).await?
    };
    let plan = if spec.buckets > 1 {
        plan_bases(&mut redis, previous.as_ref(), &spec).await?
    } else {
        plan_stock(held, previous.as_ref(), &spec)
    };
    // A decrease keeps its buckets' `moving` markers until it is final
    // (committed, or moved back): until then no gateway confirms the sale
    // dry from buckets it may give items back to.
    let (decreased, markers) = match plan {
        Some(from) if spec.stock < from && spec.buckets > 1 => {
            decrease_bases(&mut redis, &spec, from).await?
        }
        _ => (None, stock::Markers::default()),
    };
    // A fenced sale's stock does not change until its re-sync (what it
    // sold is not known yet): `lua/update_sale.lua` and
    // `lua/bucket_stock.lua` refuse a decrease, and a raise, which reaches
    // Redis only after the commit, is refused here before it.
    if matches!(plan, Some(from) if spec.stock > from) {
        if spec.buckets > 1 {
            stock::check(&mut redis, &spec.id, spec.buckets).await?;
        } else if crate::fence::is_fenced(&mut redis, &spec.id).await? {
            return Err(crate::error::SaleError::Fenced.into());
        }
    }
    let applied =
        match sales::apply(&mut redis, &state.store, &before_commit(&spec, held, plan)).await {
            Ok(applied) => applied,
            Err(error) => {
                revert_bases(&mut redis, &spec, decreased).await;
                markers.end(&mut redis).await;
                return Err(error.into());
            }
        };
    match applied {
        Applied::StockBelowSold { sold } => {
            revert_bases(&mut redis, &spec, decreased).await;
            markers.end(&mut redis).await;
            return Err(stock_below_sold(spec.stock, sold));
        }
        Applied::Updated { .. } | Applied::Preheated { .. } => {}
    }
    markers.refresh(&mut redis).await;
    if let Err(error) = write.commit().await {
        // Redis has the new definition, and the commit may have happened
        // after all: Redis is made to match what the database holds now.
        let refused = &state.metrics.stock_reverts_refused;
        after_failed_commit(
            &mut redis,
            &state.store,
            &spec,
            previous.as_ref(),
            decreased,
            refused,
        )
        .await;
        markers.end(&mut redis).await;
        return Err(error.into());
    }
    markers.end(&mut redis).await;
    let raised = match plan {
        Some(from) if spec.stock > from => {
            raise_after_commit(&mut redis, &state.store, &spec.id).await
        }
        _ => Ok(()),
    };
    // Final now: gateways re-read the sale (and forget a sold-out flag the
    // raise made wrong).
    announce(&mut redis, &SaleEvent::Changed(spec.id.clone())).await;
    if let Err(error) = raised {
        tracing::warn!(%error, sale = %spec.id, "the raised stock is saved but its items are not in redis yet");
        return Err(ApiError::unavailable(
            "the stock is saved, but its new items are not in redis yet (redis failed, or the sale is fenced until its re-sync); send the change again or let reconciliation add them",
        ));
    }
    // Archived again meanwhile (the archiver read the old window): live
    // again. The change is saved either way; an operator told 503 sends it
    // again, and the consumers' supervisor reopens an archived sale whose
    // window is open on its own.
    if let Err(error) = crate::stream::retention::unarchive(&mut redis, &spec.id).await {
        tracing::warn!(%error, sale = %spec.id, "cannot unarchive the changed sale; its consumer stays stopped");
        return Err(ApiError::unavailable(
            "the sale is saved but may stay archived (redis failed); send the change again",
        ));
    }
    // A sale installed just now (new, or lost by Redis) is fenced until it
    // is re-synced, which holds its row: only now, after the commit. If it
    // fails, the recovery loop's next pass does it.
    if let Err(error) = state.fence.resync(&mut redis, &state.store, &spec.id).await {
        tracing::warn!(%error, sale = %spec.id, "cannot re-sync the saved sale yet; the recovery loop will");
    }
    tracing::info!(sale = %spec.id, stock = spec.stock, created = previous.is_none(), "sale saved");
    let status = if previous.is_none() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let view = sales::view(&mut redis, &state.store, spec).await?;
    Ok((status, Json(view)).into_response())
}

/// Refuses what a saved sale cannot change: its bucket count (the items
/// would have to be re-split over other hash tags).
fn bucket_change(old: &SaleSpec, new: &SaleSpec) -> Result<(), ApiError> {
    if old.buckets != new.buckets {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "buckets_fixed",
            format!("buckets: a saved sale keeps its bucket count ({}); changing it is not supported yet", old.buckets),
        ));
    }
    Ok(())
}

/// 409 `stock_below_sold`: the same answer for a sale and a bucketed sale.
fn stock_below_sold(stock: i64, sold: i64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "stock_below_sold",
        format!("stock: {stock} is below the {sold} items already sold"),
    )
}

/// Whether the bases of bucketed sale `new` move, and from what Σ: `None`
/// when they stay (the stock is unchanged and nothing is missing from the
/// buckets, so a rename or a window change never gets a 409; or no bucket
/// is in Redis, and `sales::apply` installs the sale with the new stock).
/// Decided by Redis, not by the saved row: a sale whose buckets are in
/// Redis but whose row is not (a create that failed to commit) still has
/// its bases moved. Some buckets absent: 409 `bucketed_sale_absent`.
async fn plan_bases<C: redis::aio::ConnectionLike + Send>(
    redis: &mut C,
    old: Option<&SaleSpec>,
    new: &SaleSpec,
) -> Result<Option<i64>, ApiError> {
    match crate::buckets::present(redis, &new.id, new.buckets).await? {
        0 => return Ok(None),
        n if n < new.buckets => return Err(crate::error::SaleError::LeftAbsent.into()),
        _ => {}
    }
    let from: i64 = stock::bases(redis, &new.id, new.buckets)
        .await?
        .iter()
        .sum();
    // Same stock: only items missing after a crash are added (an increase
    // is never refused); a surplus is reconciliation's to take.
    let unchanged = old.is_some_and(|o| o.stock == new.stock);
    if from == new.stock || (unchanged && from > new.stock) {
        return Ok(None);
    }
    Ok(Some(from))
}

/// Whether the stock one-bucket sale `new` sells from in Redis (`held`,
/// `None` when absent) moves, and from what: as [`plan_bases`], decided
/// by Redis. `None` when it stays: the same stock; a surplus while the
/// saved stock is unchanged (reconciliation's to take, so a rename never
/// gets a 409); or the sale is absent, and `sales::apply` installs it
/// fenced with the new stock (it sells once re-synced after the commit).
fn plan_stock(held: Option<i64>, old: Option<&SaleSpec>, new: &SaleSpec) -> Option<i64> {
    let from = held?;
    let unchanged = old.is_some_and(|o| o.stock == new.stock);
    if from == new.stock || (unchanged && from > new.stock) {
        return None;
    }
    Some(from)
}

/// The definition Redis gets before the commit: `spec`, except that a
/// one-bucket sale keeps the stock Redis sells from (`held`) when it would
/// rise (raised after the commit, [`raise_after_commit`]) or when
/// [`plan_stock`] leaves it in place (`plan` `None`). A bucketed sale's
/// stock is in its bases, moved apart.
fn before_commit(spec: &SaleSpec, held: Option<i64>, plan: Option<i64>) -> SaleSpec {
    let stock = match (held, plan) {
        _ if spec.buckets > 1 => spec.stock,
        (Some(held), None) => held,
        (_, Some(from)) if spec.stock > from => from,
        _ => spec.stock,
    };
    SaleSpec {
        stock,
        ..spec.clone()
    }
}

/// Takes the buckets' bases of `new` down from Σ `from` to `new.stock`,
/// all or nothing; answers the Σ to move them back to if the change fails
/// before its commit, and the markers of the buckets lowered, for the
/// caller to end once the change is committed or moved back.
async fn decrease_bases<C: redis::aio::ConnectionLike + Send>(
    redis: &mut C,
    new: &SaleSpec,
    from: i64,
) -> Result<(Option<i64>, stock::Markers), ApiError> {
    stock::check(redis, &new.id, new.buckets).await?;
    match stock::move_keeping_markers(
        redis,
        &new.id,
        new.buckets,
        new.stock,
        stock::Short::GiveBack,
    )
    .await?
    {
        (stock::Moved::Refused { sold }, markers) => {
            markers.end(redis).await;
            Err(stock_below_sold(new.stock, sold))
        }
        (stock::Moved::Done { changes, .. }, markers) if changes.iter().all(|c| *c == 0) => {
            Ok((None, markers))
        }
        (stock::Moved::Done { changes, .. }, markers) => {
            tracing::info!(sale = %new.id, from, to = new.stock, ?changes, "bucket bases lowered by a stock change");
            Ok((Some(from), markers))
        }
    }
}

/// After the commit of a raised stock: under the sale's row hold (no other
/// change, repair or re-sync meanwhile), moves the stock Redis sells from
/// to the one the database holds now: the buckets' bases, or a one-bucket
/// sale's stock (its saved definition applied). Until this runs no buyer
/// can take an item the database may not hold; a crash before it leaves
/// too few items in Redis, which reconciliation adds.
///
/// # Errors
/// Redis or the database failed, or the sale is fenced (its re-sync then
/// applies the saved stock).
async fn raise_after_commit<C: redis::aio::ConnectionLike + Send>(
    redis: &mut C,
    store: &Store,
    id: &str,
) -> Result<(), crate::error::SaleError> {
    let mut hold = store.locks().begin_resync(id).await?;
    let saved = hold.sale(id).await?;
    let moved = match &saved {
        Some(spec) if spec.buckets > 1 => {
            stock::move_to(redis, id, spec.buckets, spec.stock, stock::Short::Keep)
                .await
                .map(|m| Some(format!("{m:?}")))
        }
        // Absent: the restore loop installs it from the row.
        Some(spec) => sales::apply_present(redis, spec)
            .await
            .map(|a| a.map(|a| format!("{a:?}"))),
        None => Ok(None),
    };
    hold.commit().await?;
    if let Some(moved) = moved? {
        tracing::info!(sale = id, moved, "stock raised in redis after its commit");
    }
    Ok(())
}

/// Moves the bases of `spec`'s buckets back to `to` after the change
/// failed before its commit (the row's hold still held), as far as unsold
/// items allow; what cannot be moved back is logged and left to
/// reconciliation (Σ bases = the database's stock).
async fn revert_bases<C: redis::aio::ConnectionLike + Send>(
    redis: &mut C,
    spec: &SaleSpec,
    to: Option<i64>,
) {
    let Some(to) = to else { return };
    match stock::move_to(redis, &spec.id, spec.buckets, to, stock::Short::Keep).await {
        Ok(stock::Moved::Done { missing: 0, .. }) => {}
        Ok(moved) => {
            tracing::error!(sale = %spec.id, to, ?moved, "bucket bases only partly moved back; reconciliation repairs them")
        }
        Err(error) => {
            tracing::error!(%error, sale = %spec.id, to, "cannot move the bucket bases back; reconciliation repairs them")
        }
    }
}

/// After a failed (or ambiguous) commit of `spec`: under the sale's row
/// hold, re-reads what the database holds and makes Redis match it, the
/// definition and (bucketed) the bases, never the old values blindly (the
/// commit may have happened). No row (a create that did not commit): the
/// bases go back to Σ `decreased_from` if they were lowered. The database
/// unreachable: the definition read before the change (`previous`) goes
/// back, as the commit most likely did not happen, and the bases stay
/// (lowered ones are below the stock either way). Gateways are told at
/// the end. Failures are logged, a refused put-back also counted in
/// `refused` ([`put_back`]); reconciliation and the re-sync repair them.
pub(super) async fn after_failed_commit<C: redis::aio::ConnectionLike + Send + Clone>(
    redis: &mut C,
    store: &Store,
    spec: &SaleSpec,
    previous: Option<&SaleSpec>,
    decreased_from: Option<i64>,
    refused: &IntCounter,
) {
    let mut hold = match store.locks().begin_resync(&spec.id).await {
        Ok(hold) => hold,
        Err(error) => {
            tracing::error!(%error, sale = %spec.id, "cannot hold the sale after a failed commit; reconciliation repairs its bases");
            if let Some(old) = previous {
                put_back(redis, store, old, refused).await;
            }
            announce(redis, &SaleEvent::Changed(spec.id.clone())).await;
            return;
        }
    };
    match hold.sale(&spec.id).await {
        Ok(Some(saved)) => {
            put_back(redis, store, &saved, refused).await;
            if saved.buckets > 1
                && crate::buckets::present(redis, &saved.id, saved.buckets)
                    .await
                    .is_ok_and(|n| n == saved.buckets)
            {
                revert_bases(redis, &saved, Some(saved.stock)).await;
            }
        }
        Ok(None) => revert_bases(redis, spec, decreased_from).await,
        Err(error) => {
            tracing::error!(%error, sale = %spec.id, "cannot read the sale after a failed commit; reconciliation repairs its bases")
        }
    }
    if let Err(error) = hold.commit().await {
        tracing::warn!(%error, sale = %spec.id, "cannot end the hold after a failed commit");
    }
    announce(redis, &SaleEvent::Changed(spec.id.clone())).await;
}

/// Puts definition `saved` (what the database holds) back in Redis after a
/// failed commit. Refused (more items are sold than `saved.stock`: Redis
/// sold items the database does not hold) is an error, never an outcome
/// to pass over: logged and counted in `refused`
/// (`flashgate_backend_stock_reverts_refused_total`), and reconciliation
/// reports the surplus as drift. The change order of [`put`] makes it
/// unreachable but for a surplus Redis held before the change.
async fn put_back<C: redis::aio::ConnectionLike + Send + Clone>(
    redis: &mut C,
    store: &Store,
    saved: &SaleSpec,
    refused: &IntCounter,
) {
    match sales::apply(redis, store, saved).await {
        Ok(Applied::Updated { .. } | Applied::Preheated { .. }) => {}
        Ok(Applied::StockBelowSold { sold }) => {
            refused.inc();
            tracing::error!(
                sale = %saved.id,
                stock = saved.stock,
                sold,
                "cannot put the saved stock back in redis after a failed commit: more items are sold; redis sells more than the database holds"
            );
        }
        Err(crate::error::SaleError::Fenced) => {
            tracing::warn!(sale = %saved.id, "the sale is fenced; its re-sync puts the saved definition back in redis")
        }
        Err(error) => {
            tracing::error!(%error, sale = %saved.id, "cannot put the saved definition back in redis after a failed commit")
        }
    }
}

/// `GET /admin/sales/{id}`.
pub async fn show(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<SaleView>, ApiError> {
    let id = sale_id(id)?;
    let spec = state
        .store
        .sales()
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such sale"))?;
    Ok(Json(
        sales::view(&mut state.redis.clone(), &state.store, spec).await?,
    ))
}

/// `GET /admin/sales/{id}/draw`: the opening draw's record, for an audit:
/// its state (seed, window close, cursor), every entrant in arrival order,
/// the order decided, each outcome, and whether that order is the one the
/// seed gives (`order_matches_seed`, recomputed here; see
/// docs/RELIABILITY.md). 404 `not_found` when the sale has no draw (or its
/// record has expired, an idempotency TTL after the draw).
pub async fn draw(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = sale_id(id)?;
    match flashgate_common::draw::read_record(&mut state.redis.clone(), &id).await? {
        Some(record) => Ok(Json(record).into_response()),
        None => Err(ApiError::not_found("the sale has no draw record")),
    }
}

/// `GET /admin/sales/{id}/dead-letters`: entries the consumer could not
/// turn into orders, oldest first, with their errors.
pub async fn dead_letters(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = sale_id(id)?;
    state
        .store
        .sales()
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such sale"))?;
    let entries = dead_letter::list(&mut state.redis.clone(), &id).await?;
    Ok(Json(serde_json::json!({"sale_id": id, "dead_letters": entries})).into_response())
}

/// `POST /admin/sales/{id}/dead-letters/{entry_id}/retry`: puts the entry
/// back on the sale's stream (202 with its new id); the consumer tries it
/// again, and dead-letters it again if it still fails.
pub async fn retry_dead_letter(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, entry_id)) = ids?;
    if !valid_sale_id(&id) {
        return Err(ApiError::bad_request(
            "id: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
        ));
    }
    if !dead_letter::valid_entry_id(&entry_id) {
        return Err(ApiError::bad_request(
            "entry_id: must be a stream entry id like 1700000000000-0",
        ));
    }
    let mut redis = state.redis.clone();
    // The entry needs a consumer again, even on a finished sale: live
    // before the entry moves, so a failure here moves nothing.
    crate::stream::retention::unarchive(&mut redis, &id).await?;
    match dead_letter::retry(&mut redis, &id, &entry_id).await? {
        Some(requeued) => {
            // Again after the move: an archiving that read the streams
            // before it and added the sale after the first removal sees
            // the entry on its re-check, or is undone here.
            if let Err(error) = crate::stream::retention::unarchive(&mut redis, &id).await {
                tracing::warn!(%error, sale = %id, "cannot confirm the sale is live after a dead letter was put back");
            }
            tracing::info!(sale = %id, entry = %entry_id, %requeued, "dead letter put back on the stream");
            Ok((
                StatusCode::ACCEPTED,
                Json(serde_json::json!({"requeued_as": requeued})),
            )
                .into_response())
        }
        None => Err(ApiError::not_found("no such dead letter")),
    }
}

/// `POST /admin/sales/{id}/reconcile`: reconciles the sale now and answers
/// the report (what was repaired, the drift left).
pub async fn reconcile(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = sale_id(id)?;
    let spec = state
        .store
        .sales()
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such sale"))?;
    match crate::reconcile::reconcile_spec(&mut state.redis.clone(), &state.store, &spec).await? {
        Some(report) => {
            if report.settled {
                state
                    .drift
                    .gauge(&id)
                    .store(report.drift, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(Json(report).into_response())
        }
        None => Err(ApiError::unavailable(
            "the sale is not in redis yet (being restored)",
        )),
    }
}

/// `GET /admin/sales`: every sale, ordered by id.
pub async fn list(State(state): State<AppState>) -> Result<Json<Vec<SaleView>>, ApiError> {
    let mut redis = state.redis.clone();
    let mut views = Vec::new();
    for spec in state.store.sales().all().await? {
        views.push(sales::view(&mut redis, &state.store, spec).await?);
    }
    Ok(Json(views))
}

/// `POST /admin/sales/{id}/pause` and `/resume`: stops or restarts buying
/// of one sale on every gateway, without a restart. Kept in the database
/// (written first), so a sale Redis lost is restored paused; while the sale
/// is absent from Redis the answer is still 200 and the restore applies it.
pub async fn pause(
    state: State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    set_paused(state, id, true).await
}

pub async fn resume(
    state: State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    set_paused(state, id, false).await
}

async fn set_paused(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    paused: bool,
) -> Result<Response, ApiError> {
    let id = sale_id(id)?;
    let applied =
        match switches::set_paused(&mut state.redis.clone(), &state.store, &id, paused).await? {
            switches::Paused::Unknown => return Err(ApiError::not_found("no such sale")),
            switches::Paused::Applied => true,
            // Absent from Redis (being restored): the restore applies it.
            switches::Paused::Recorded => false,
        };
    tracing::info!(sale = %id, paused, in_redis = applied, "sale pause switched by an operator");
    Ok(Json(serde_json::json!({"sale_id": id, "paused": paused})).into_response())
}

/// Body of `PUT /admin/switch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchBody {
    pub paused: bool,
}

/// `PUT /admin/switch` `{"paused": true|false}`: the global switch; while
/// paused, every buy on every gateway gets `503 paused`. Kept in the
/// database, so a Redis that restarts empty gets it back.
pub async fn switch(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let SwitchBody { paused } = parse_json(&body?)?;
    switches::set_all_paused(&mut state.redis.clone(), &state.store, paused).await?;
    tracing::warn!(paused, "global sale switch turned by an operator");
    Ok(Json(serde_json::json!({"paused": paused})).into_response())
}
