//! What the tests read straight from an order database.

/// Orders of a sale in a database: (orders, distinct users, most orders of one user).
pub async fn db_orders(database_url: &str, sale: &str) -> (i64, i64, i64) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let (total,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE sale_id = $1").bind(sale).fetch_one(&pool).await.unwrap();
    let (users, most): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(MAX(n), 0) FROM \
         (SELECT user_id, COUNT(*) AS n FROM orders WHERE sale_id = $1 GROUP BY user_id) AS per_user",
    )
    .bind(sale)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    (total, users, most)
}

/// One order row as the reliability tests check it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderRow {
    pub order_id: String,
    pub reservation_id: String,
    pub user_id: String,
    pub status: String,
}

/// Every order of a sale in a database.
pub async fn db_order_rows(database_url: &str, sale: &str) -> Vec<OrderRow> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let rows: Vec<(String, String, String, String)> =
        sqlx::query_as("SELECT order_id, reservation_id, user_id, status FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().map(|(order_id, reservation_id, user_id, status)| OrderRow { order_id, reservation_id, user_id, status }).collect()
}
