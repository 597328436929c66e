//! A stock raise of a one-bucket sale cut between its Redis step and its
//! commit while buyers hammer: the database's connection is cut (its
//! PostgreSQL session terminated), or the backend is killed and its
//! session with it. Whatever happens, Redis never sells an item the
//! database's stock does not hold: the orders never exceed that stock.
//!
//! The commit is stopped at an exact point with no timing involved: a
//! deferred constraint trigger on `sales` (it runs inside the commit)
//! waits for an advisory lock the test holds; the test sees the backend's
//! session wait on it, hammers, cuts, then lets go.

use std::time::{Duration, Instant};

use sqlx::Connection;

use super::{redis_label, users, CONCURRENCY, SETTLE};
use flashgate_tests::{buy_all, Outcome, PostgresDatabase, Stack, StackOptions};

/// The stock the sale opens with (sold out before each raise).
const OPENING: i64 = 20;
/// Buyers per burst: more than any raise adds.
const BURST: usize = 60;

/// How the raise is cut while its commit waits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The backend's database session is terminated: its commit fails,
    /// and the backend puts back what the database holds.
    Connection,
    /// The backend is killed (SIGKILL) and its session terminated: it
    /// never gets to put anything back; it is started again.
    Backend,
}

/// A connection to the stack's database holding the commit gate: while
/// it lives, any commit that changes a sale's stock waits inside the
/// trigger for `key`.
struct CommitGate {
    conn: sqlx::AnyConnection,
    key: i64,
}

impl CommitGate {
    /// Installs the trigger (once per database) and takes the lock.
    async fn close(database_url: &str) -> Self {
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(database_url).await.unwrap();
        let key = i64::from(rand::random::<u32>() >> 1);
        for statement in [
            format!(
                "CREATE OR REPLACE FUNCTION fg_test_commit_gate() RETURNS trigger AS $$ \
                 BEGIN PERFORM pg_advisory_xact_lock({key}); RETURN NULL; END $$ LANGUAGE plpgsql"
            ),
            "DROP TRIGGER IF EXISTS fg_test_commit_gate ON sales".to_owned(),
            "CREATE CONSTRAINT TRIGGER fg_test_commit_gate AFTER UPDATE ON sales DEFERRABLE INITIALLY DEFERRED \
             FOR EACH ROW WHEN (NEW.stock <> OLD.stock) EXECUTE FUNCTION fg_test_commit_gate()"
                .to_owned(),
            format!("SELECT pg_advisory_lock({key})"),
        ] {
            sqlx::query(&statement).execute(&mut conn).await.unwrap();
        }
        Self { conn, key }
    }

    /// The session of the commit waiting at the gate, once there (bounded).
    async fn waiting(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let query = format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = {} \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            self.key
        );
        loop {
            let found: Option<(i32,)> = sqlx::query_as(&query)
                .fetch_optional(&mut self.conn)
                .await
                .unwrap();
            if let Some((pid,)) = found {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "no commit came to wait at the gate"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Terminates the database session `pid` (its transaction rolls back).
    async fn terminate(&mut self, pid: i32) {
        let (done,): (bool,) = sqlx::query_as(&format!("SELECT pg_terminate_backend({pid})"))
            .fetch_one(&mut self.conn)
            .await
            .unwrap();
        assert!(done, "session {pid} terminated");
    }

    /// Lets commits through and removes the trigger.
    async fn open(mut self) {
        sqlx::query(&format!("SELECT pg_advisory_unlock({})", self.key))
            .execute(&mut self.conn)
            .await
            .unwrap();
        sqlx::query("DROP TRIGGER IF EXISTS fg_test_commit_gate ON sales")
            .execute(&mut self.conn)
            .await
            .unwrap();
        self.conn.close().await.ok();
    }
}

/// The sale's stock as the database holds it.
async fn stock_in_database(stack: &Stack, sale: &str) -> i64 {
    let mut conn = sqlx::AnyConnection::connect(&stack.database_url)
        .await
        .unwrap();
    let (stock,): (i64,) = sqlx::query_as("SELECT stock FROM sales WHERE id = $1")
        .bind(sale)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.ok();
    stock
}

/// Waits until every winner has its order; then the live orders must not
/// exceed the database's stock, and once Redis agrees (`remaining + live =
/// stock`, reconciliation adding what a cut left out) the sale is settled.
/// Answers (live orders, stock).
async fn settle(stack: &Stack, sale: &str, fault: &str, winners: &[&Outcome]) -> (i64, i64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let rows = stack.order_rows(sale).await;
        let live = rows.iter().filter(|r| r.status != "cancelled").count() as i64;
        let stock = stock_in_database(stack, sale).await;
        assert!(
            live <= stock,
            "{fault}: {live} orders for a stock of {stock} in the database"
        );
        let with_order: std::collections::HashSet<&str> =
            rows.iter().map(|r| r.reservation_id.as_str()).collect();
        let all_winners = winners.iter().all(|w| {
            w.reservation_id()
                .is_some_and(|rid| with_order.contains(rid))
        });
        let remaining = stack.remaining(sale).await;
        if all_winners && remaining >= 0 && remaining + live == stock {
            return (live, stock);
        }
        assert!(
            Instant::now() < deadline,
            "{fault}: did not settle: remaining {remaining} + live {live} != stock {stock}, or a winner has no order (all: {all_winners})\nbackend log:\n{}",
            stack.log("flashgate-backend")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Raises the sale to `to` with its commit held at the gate, hammers it
/// meanwhile, cuts as `cut` says, and checks the orders against the
/// database's stock. Answers the winners of the hammering.
async fn cut_raise(stack: &mut Stack, sale: &str, to: i64, cut: Cut) -> Vec<Outcome> {
    let mut gate = CommitGate::close(&stack.database_url).await;
    let put = {
        let (http, url) = (
            stack.http.clone(),
            stack.admin_url(&format!("/admin/sales/{sale}")),
        );
        let now = flashgate_common::now_ms();
        let body = serde_json::json!({
            "name": format!("Sale {sale}"), "stock": to, "per_user_limit": 1,
            "starts_at": flashgate_common::rfc3339(now - 60_000), "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        });
        tokio::spawn(async move {
            match http
                .put(url)
                .bearer_auth(flashgate_tests::ADMIN_TOKEN)
                .json(&body)
                .send()
                .await
            {
                Ok(resp) => resp.status().as_u16(),
                Err(_) => 0,
            }
        })
    };
    let session = gate.waiting().await;
    // The change is between its Redis step and its commit: buyers hammer.
    let outcomes = buy_all(stack.gateway_addr, sale, users(BURST), CONCURRENCY).await;
    match cut {
        Cut::Connection => gate.terminate(session).await,
        Cut::Backend => {
            stack.kill_backend();
            gate.terminate(session).await;
        }
    }
    let status = put.await.unwrap();
    assert!(
        ![200, 201].contains(&status),
        "the cut raise was answered {status}"
    );
    gate.open().await;
    if cut == Cut::Backend {
        stack.start_backend();
    }
    outcomes.into_iter().filter(Outcome::won).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_raise_cut_before_its_commit_while_buyers_hammer_never_sells_past_the_database_stock(
) {
    let database = PostgresDatabase::create().await;
    let opts = StackOptions {
        redis_mode: super::faults_redis(),
        database_url: Some(database.url.clone()),
        ..StackOptions::default()
    };
    let mut stack = Stack::start(opts).await;
    let sale = "f-raise-cut";
    stack.open_sale(sale, OPENING, 1).await;
    let mut winners: Vec<Outcome> = buy_all(stack.gateway_addr, sale, users(BURST), CONCURRENCY)
        .await
        .into_iter()
        .filter(Outcome::won)
        .collect();
    let mut sent = BURST;

    for (fault, cut, to) in [
        ("raise_commit_connection_cut", Cut::Connection, 2 * OPENING),
        ("raise_commit_backend_kill9", Cut::Backend, 3 * OPENING),
    ] {
        winners.extend(cut_raise(&mut stack, sale, to, cut).await);
        sent += BURST;
        let won: Vec<&Outcome> = winners.iter().collect();
        let (live, stock) = settle(&stack, sale, fault, &won).await;
        assert_eq!(stock, OPENING, "{fault}: the cut commit changed nothing");
        assert_eq!(live, OPENING, "{fault}: nothing more was sold");
        println!(
            "fault={fault} redis={} sent={sent} winners={} orders={live} remaining={} stock={stock}",
            redis_label(&stack),
            winners.len(),
            stock - live
        );
    }

    // A raise that commits goes live after its commit, all of it.
    stack
        .put_sale(
            sale,
            2 * OPENING,
            1,
            Duration::ZERO,
            Duration::from_secs(3600),
        )
        .await;
    winners.extend(
        buy_all(stack.gateway_addr, sale, users(BURST), CONCURRENCY)
            .await
            .into_iter()
            .filter(Outcome::won),
    );
    let won: Vec<&Outcome> = winners.iter().collect();
    let (live, stock) = settle(&stack, sale, "raise_committed", &won).await;
    assert_eq!(
        (live, stock),
        (2 * OPENING, 2 * OPENING),
        "the committed raise sold out"
    );
}
