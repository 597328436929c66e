//! What the tests read straight from an order database.

/// `sql` (one `$1` placeholder) as the database of `database_url` takes it:
/// MySQL binds `?`.
fn dialect(database_url: &str, sql: &str) -> String {
    if database_url.starts_with("mysql:") {
        sql.replace("$1", "?")
    } else {
        sql.to_owned()
    }
}

/// Orders of a sale in a database: (orders, distinct users, most orders of one user).
pub async fn db_orders(database_url: &str, sale: &str) -> (i64, i64, i64) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let (total,): (i64,) =
        sqlx::query_as(&dialect(database_url, "SELECT COUNT(*) FROM orders WHERE sale_id = $1")).bind(sale).fetch_one(&pool).await.unwrap();
    let (users, most): (i64, i64) = sqlx::query_as(&dialect(
        database_url,
        "SELECT COUNT(*), COALESCE(MAX(n), 0) FROM \
         (SELECT user_id, COUNT(*) AS n FROM orders WHERE sale_id = $1 GROUP BY user_id) AS per_user",
    ))
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
        sqlx::query_as(&dialect(database_url, "SELECT order_id, reservation_id, user_id, status FROM orders WHERE sale_id = $1"))
            .bind(sale)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().map(|(order_id, reservation_id, user_id, status)| OrderRow { order_id, reservation_id, user_id, status }).collect()
}

/// The MariaDB (MySQL) server the tests use: root, no password
/// (`deploy/local/install-deps.sh --test` installs and starts it).
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";

/// A database of the test's own on [`MYSQL_SERVER`], dropped with this value.
pub struct MysqlDatabase {
    name: String,
    /// What a backend is configured with.
    pub url: String,
}

impl MysqlDatabase {
    /// Creates `flashgate_t_<unix seconds>_<random>` (the backend's store
    /// tests name theirs the same way and drop leftovers older than an hour).
    pub async fn create() -> Self {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let name = format!("flashgate_t_{now}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let mut conn = sqlx::AnyConnection::connect(MYSQL_SERVER).await.expect("MariaDB on 127.0.0.1:3306 (make test starts it)");
        sqlx::query(&format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")).execute(&mut conn).await.unwrap();
        conn.close().await.ok();
        Self { url: format!("{MYSQL_SERVER}/{name}"), name }
    }
}

/// The shared PostgreSQL server the tests use (trust auth).
pub const POSTGRES_SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// A database of its own on [`POSTGRES_SERVER`], dropped with this value.
pub struct PostgresDatabase {
    name: String,
    /// What a backend is configured with.
    pub url: String,
}

impl PostgresDatabase {
    /// Creates `flashgate_t_<unix seconds>_<random>`.
    pub async fn create() -> Self {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let name = format!("flashgate_t_{now}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let mut conn = sqlx::AnyConnection::connect(&format!("{POSTGRES_SERVER}/postgres")).await.expect("PostgreSQL on 127.0.0.1:5432");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.unwrap();
        conn.close().await.ok();
        Self { url: format!("{POSTGRES_SERVER}/{name}"), name }
    }
}

impl Drop for PostgresDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        // Not from inside the test's runtime: a thread with its own.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::AnyConnection::connect(&format!("{POSTGRES_SERVER}/postgres")).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await;
                    let _ = conn.close().await;
                }
            });
        })
        .join();
    }
}

impl Drop for MysqlDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        // Not from inside the test's runtime: a thread with its own.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::AnyConnection::connect(MYSQL_SERVER).await {
                    let _ = sqlx::query("SET SESSION lock_wait_timeout = 5").execute(&mut conn).await;
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{name}`")).execute(&mut conn).await;
                    let _ = conn.close().await;
                }
            });
        })
        .join();
    }
}
