//! The books after a buy run on Flashgate: what the load generator saw
//! against what Redis and PostgreSQL hold once the backend has drained.

use std::time::{Duration, Instant};

use crate::results::Check;
use crate::stack::Flashgate;

/// winners = stock decrements = reservations = orders persisted, and no
/// user above the limit (1), after the backend drained the stream.
/// `scripts`: Redis's script calls in the run, and the backend's timed trim
/// scripts that may be among them.
pub async fn check_flashgate(
    fg: &Flashgate,
    pg: &sqlx::PgPool,
    sale: &str,
    stock: i64,
    winners: u64,
    scripts: (u64, u64),
    reached: Option<u64>,
) -> anyhow::Result<Check> {
    let (calls, trims) = scripts;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(120);
    let view = loop {
        let v = fg.admin_sale(sale).await?;
        let settled =
            v["orders"].as_i64() == v["reservations"].as_i64() && v["pending"].as_i64() == Some(0);
        if settled || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let remaining = view["remaining"].as_i64().unwrap_or(-1);
    let reservations = view["reservations"].as_i64().unwrap_or(-1);
    let orders = view["orders"].as_i64().unwrap_or(-1);
    let (most,): (i64,) = sqlx::query_as(
        "SELECT COALESCE(MAX(n), 0) FROM (SELECT user_id, COUNT(*) AS n FROM orders WHERE sale_id = $1 GROUP BY user_id) AS per_user",
    )
    .bind(sale)
    .fetch_one(pg)
    .await?;
    let decrements = stock - remaining;
    // Every buy that reached Redis was decided by a script call, one call
    // deciding the concurrent buys of a sale together: at most one call per
    // buy, and at least one while any buy reached Redis; any other call is
    // one of the backend's trims.
    let buy_calls = calls.saturating_sub(trims);
    let script_ok = reached.is_none_or(|r| buy_calls <= r && (r == 0 || calls > 0));
    let ok = winners as i64 == decrements
        && decrements == reservations
        && reservations == orders
        && most <= 1
        && remaining >= 0
        && script_ok;
    let text = format!(
        "winners {winners} = decrements {decrements} = reservations {reservations} = orders {orders}; most orders of one user {most} (limit 1); drained in {:.1}s; script calls {calls} (the backend's timed trims among them: at most {trims}){}",
        t.elapsed().as_secs_f64(),
        reached.map_or(String::new(), |r| format!(" for {r} buys that reached Redis")),
    );
    // The calls the buys account for: every trim is not theirs.
    let for_buys = reached.map(|r| (buy_calls, r));
    Ok(Check {
        ok,
        text,
        script_calls: for_buys,
        redis: None,
    })
}
