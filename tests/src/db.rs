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
    let (total,): (i64,) = sqlx::query_as(&dialect(
        database_url,
        "SELECT COUNT(*) FROM orders WHERE sale_id = $1",
    ))
    .bind(sale)
    .fetch_one(&pool)
    .await
    .unwrap();
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
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(&dialect(
        database_url,
        "SELECT order_id, reservation_id, user_id, status FROM orders WHERE sale_id = $1",
    ))
    .bind(sale)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.into_iter()
        .map(|(order_id, reservation_id, user_id, status)| OrderRow {
            order_id,
            reservation_id,
            user_id,
            status,
        })
        .collect()
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
        let name = database_name();
        let create = format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin");
        administer(MYSQL_SERVER, &[&create])
            .await
            .expect("a database created on MariaDB at 127.0.0.1:3306 (make test starts it)");
        Self {
            url: format!("{MYSQL_SERVER}/{name}"),
            name,
        }
    }
}

/// The shared PostgreSQL server the tests use (trust auth).
pub const POSTGRES_SERVER: &str = "postgres://postgres@127.0.0.1:5432";
/// Where databases are created and dropped on [`POSTGRES_SERVER`].
const POSTGRES_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database of its own on [`POSTGRES_SERVER`], dropped with this value.
pub struct PostgresDatabase {
    name: String,
    /// What a backend is configured with.
    pub url: String,
}

impl PostgresDatabase {
    /// Creates `flashgate_t_<unix seconds>_<random>`.
    pub async fn create() -> Self {
        let name = database_name();
        administer(POSTGRES_ADMIN, &[&format!("CREATE DATABASE {name}")])
            .await
            .expect("a database created on PostgreSQL at 127.0.0.1:5432");
        Self {
            url: format!("{POSTGRES_SERVER}/{name}"),
            name,
        }
    }
}

impl Drop for PostgresDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        drop_database(
            POSTGRES_ADMIN,
            vec![format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")],
        );
    }
}

impl Drop for MysqlDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        drop_database(
            MYSQL_SERVER,
            vec![
                "SET SESSION lock_wait_timeout = 5".into(),
                format!("DROP DATABASE IF EXISTS `{name}`"),
            ],
        );
    }
}

/// `flashgate_t_<unix seconds>_<random>`.
fn database_name() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!(
        "flashgate_t_{now}_{:012x}",
        rand::random::<u64>() & 0xffff_ffff_ffff
    )
}

/// Runs every one of `statements` on one connection to `admin`; the first
/// error, if any.
async fn administer(admin: &str, statements: &[&str]) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(admin).await?;
    let mut first_error = None;
    for statement in statements {
        if let Err(e) = sqlx::query(statement).execute(&mut conn).await {
            first_error.get_or_insert(e);
        }
    }
    conn.close().await.ok();
    first_error.map_or(Ok(()), Err)
}

/// Drops a test's database from a `Drop`: not from inside the test's
/// runtime, but on a thread with its own; a failure leaves the database
/// behind (on MySQL, the backend's store tests drop those older than an
/// hour).
fn drop_database(admin: &'static str, statements: Vec<String>) {
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
        let _ = runtime.block_on(administer(admin, &statements));
    })
    .join();
}
