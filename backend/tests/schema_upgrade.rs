//! Databases made before the schema was kept by migrations upgrade in
//! place: one made by release 7858481 (the last before migrations) and one
//! made by the first release, each on SQLite and on PostgreSQL (a schema of
//! its own in the shared `test` database, dropped afterwards). The backend's
//! store opens each, keeps every row, records the migrations, ends with the
//! schema a fresh database gets, and works.

use flashgate_backend::store::{OrderStatus, Store};
use flashgate_common::reservation::{Reservation, ReservationStatus};
use flashgate_common::sale::SaleSpec;
use sqlx::{AnyPool, Row};

const POSTGRES_SERVER: &str = "postgres://postgres@127.0.0.1:5432/test";
const RELEASE_7858481: &str = include_str!("fixtures/release_7858481.sql");
const FIRST_RELEASE: &str = include_str!("fixtures/first_release.sql");

/// A database for one test: a fresh SQLite file, or a fresh PostgreSQL
/// schema; `url` is what the backend is configured with.
struct Database {
    url: String,
    /// The PostgreSQL schema to drop at the end.
    schema: Option<String>,
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

impl Database {
    fn sqlite() -> Self {
        let dir = std::env::temp_dir().join(unique("flashgate-upgrade-"));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            url: format!("sqlite://{}", dir.join("orders.db").display()),
            schema: None,
        }
    }

    async fn postgres() -> Self {
        let schema = unique("flashgate_upgrade_");
        let server = raw_pool(POSTGRES_SERVER).await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&server)
            .await
            .expect("postgres on 127.0.0.1:5432, database test");
        server.close().await;
        Self {
            url: format!("{POSTGRES_SERVER}?options[search_path]={schema}"),
            schema: Some(schema),
        }
    }

    fn name(&self) -> &'static str {
        if self.schema.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// Runs `sql` on the database the way the release did, without the
    /// backend of this build.
    async fn create_as_released(&self, sql: &str) {
        let pool = raw_pool(&self.url).await;
        sqlx::raw_sql(sql).execute(&pool).await.unwrap();
        pool.close().await;
    }

    /// Column names, types, nullability and defaults, and index names, of
    /// the store's tables: what the store relies on.
    async fn schema(&self) -> Vec<String> {
        let pool = raw_pool(&self.url).await;
        let query = if self.schema.is_some() {
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' null=' || is_nullable || ' default=' || COALESCE(column_default, '') \
             FROM information_schema.columns WHERE table_schema = current_schema() AND table_name IN ('sales', 'orders', 'settings') \
             UNION ALL SELECT 'index ' || indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename IN ('sales', 'orders', 'settings')"
        } else {
            "SELECT m.name || '.' || c.name || ' ' || c.type || ' notnull=' || c.\"notnull\" || ' default=' || COALESCE(c.dflt_value, '') \
             FROM sqlite_master m JOIN pragma_table_info(m.name) c WHERE m.type = 'table' AND m.name IN ('sales', 'orders', 'settings') \
             UNION ALL SELECT 'index ' || name FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('sales', 'orders', 'settings')"
        };
        let mut described: Vec<String> = sqlx::query(query)
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        described.sort();
        pool.close().await;
        described
    }

    /// The migrations recorded as applied, as (version, success).
    async fn migrations(&self) -> Vec<(i64, bool)> {
        let pool = raw_pool(&self.url).await;
        // `success` is a BOOLEAN, which the `Any` driver cannot read from SQLite.
        let query = "SELECT version, CASE WHEN success THEN 1 ELSE 0 END FROM _sqlx_migrations ORDER BY version";
        let rows = sqlx::query(query).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(1) == 1))
            .collect()
    }

    async fn drop(self) {
        if let Some(schema) = self.schema {
            let server = raw_pool(POSTGRES_SERVER).await;
            sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                .execute(&server)
                .await
                .unwrap();
            server.close().await;
        }
    }
}

async fn raw_pool(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    let url = match url.strip_prefix("sqlite://") {
        Some(path) => format!("sqlite://{path}?mode=rwc"),
        None => url.to_owned(),
    };
    AnyPool::connect(&url).await.expect("connect")
}

/// Both flavours, each as an empty database.
async fn databases() -> Vec<Database> {
    vec![Database::sqlite(), Database::postgres().await]
}

/// The schema a database this build creates from nothing has.
async fn fresh_schema(flavour_of: &Database) -> Vec<String> {
    let fresh = if flavour_of.schema.is_some() {
        Database::postgres().await
    } else {
        Database::sqlite()
    };
    Store::connect(&fresh.url).await.unwrap().close().await;
    let schema = fresh.schema().await;
    fresh.drop().await;
    schema
}

fn reservation(sale_id: &str, user: &str) -> Reservation {
    Reservation {
        reservation_id: flashgate_common::reservation::reservation_id(
            sale_id,
            uuid::Uuid::new_v4().as_u128(),
        ),
        sale_id: sale_id.to_owned(),
        user_id: user.to_owned(),
        idempotency_key: "k".into(),
        reserved_at_ms: flashgate_common::now_ms(),
    }
}

#[tokio::test]
async fn a_database_of_the_last_release_before_migrations_is_adopted_with_its_rows() {
    for db in databases().await {
        let name = db.name();
        db.create_as_released(RELEASE_7858481).await;
        let store = Store::connect(&db.url)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));

        // The rows are intact.
        let spring = SaleSpec {
            id: "spring".into(),
            name: "Spring sale".into(),
            stock: 10,
            per_user_limit: 2,
            starts_at_ms: 1_700_000_000_000,
            ends_at_ms: 4_102_444_800_000,
            draw_window_ms: None,
            buckets: 1,
            checkout_url: None,
        };
        assert_eq!(
            store.sales().get("spring").await.unwrap(),
            Some(spring.clone()),
            "{name}"
        );
        assert_eq!(store.sales().all().await.unwrap().len(), 2, "{name}");
        assert_eq!(
            store.sales().payment_timeout("spring").await.unwrap(),
            Some(600),
            "{name}"
        );
        assert_eq!(
            store.sales().paused("spring").await.unwrap(),
            Some(true),
            "{name}"
        );
        assert_eq!(
            store.sales().paused("legacy").await.unwrap(),
            None,
            "{name}: never recorded stays never recorded"
        );
        assert_eq!(store.switch().paused().await.unwrap(), Some(true), "{name}");
        let mut statuses: Vec<(String, OrderStatus, Option<i64>)> = store
            .orders()
            .of_sale("spring")
            .await
            .unwrap()
            .into_iter()
            .map(|o| (o.reservation_id, o.status, o.released_at_ms))
            .collect();
        statuses.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            statuses,
            vec![
                ("spring.r1".into(), OrderStatus::Created, None),
                ("spring.r2".into(), OrderStatus::Paid, None),
                (
                    "spring.r3".into(),
                    OrderStatus::Cancelled,
                    Some(1_700_000_900_000)
                ),
                ("spring.r4".into(), OrderStatus::Cancelled, None),
            ],
            "{name}"
        );
        assert_eq!(
            store.orders().count_live("spring").await.unwrap(),
            2,
            "{name}"
        );
        assert_eq!(
            store.sales().get("spring").await.unwrap().unwrap().buckets,
            1,
            "{name}: a sale from before buckets has one"
        );
        let unreleased: Vec<String> = store
            .orders()
            .unreleased_cancelled("", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.reservation_id)
            .collect();
        assert_eq!(unreleased, vec!["spring.r4".to_owned()], "{name}");
        let view = store
            .orders()
            .by_reservation("spring.r2")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (view.user_id.as_str(), view.status),
            ("bob", ReservationStatus::Confirmed),
            "{name}"
        );

        // The migrations are recorded, and the schema is the one a fresh
        // database gets.
        assert_eq!(
            db.migrations().await,
            vec![(1, true), (10, true), (20, true), (30, true), (40, true)],
            "{name}"
        );
        assert_eq!(db.schema().await, fresh_schema(&db).await, "{name}");

        // The store works: an order is written, a sale changed and created.
        let r = reservation("spring", "erin");
        assert_eq!(
            store
                .orders()
                .insert(std::slice::from_ref(&r))
                .await
                .unwrap(),
            1,
            "{name}"
        );
        assert_eq!(
            store.orders().count_live("spring").await.unwrap(),
            3,
            "{name}"
        );
        store
            .sales()
            .upsert(&SaleSpec {
                stock: 12,
                ..spring
            })
            .await
            .unwrap();
        assert_eq!(
            store.sales().get("spring").await.unwrap().unwrap().stock,
            12,
            "{name}"
        );
        assert_eq!(
            store.sales().paused("spring").await.unwrap(),
            Some(true),
            "{name}: a change keeps the pause"
        );
        let mut summer = store.sales().get("spring").await.unwrap().unwrap();
        summer.id = "summer".into();
        store.sales().upsert(&summer).await.unwrap();
        assert_eq!(
            store.sales().paused("summer").await.unwrap(),
            Some(false),
            "{name}"
        );
        assert_eq!(
            store.sales().payment_timeout("summer").await.unwrap(),
            Some(900),
            "{name}"
        );
        store.close().await;

        // Starting again changes nothing.
        let store = Store::connect(&db.url).await.unwrap();
        assert_eq!(
            store.orders().count_live("spring").await.unwrap(),
            3,
            "{name}"
        );
        assert_eq!(
            db.migrations().await,
            vec![(1, true), (10, true), (20, true), (30, true), (40, true)],
            "{name}"
        );
        store.close().await;
        db.drop().await;
    }
}

#[tokio::test]
async fn a_database_of_the_first_release_gains_the_columns_added_since() {
    for db in databases().await {
        let name = db.name();
        db.create_as_released(FIRST_RELEASE).await;
        let store = Store::connect(&db.url)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));

        assert_eq!(
            store.sales().get("old").await.unwrap().unwrap().stock,
            5,
            "{name}"
        );
        assert_eq!(
            store.sales().payment_timeout("old").await.unwrap(),
            Some(900),
            "{name}: the default timeout"
        );
        assert_eq!(
            store.sales().paused("old").await.unwrap(),
            None,
            "{name}: never recorded"
        );
        assert_eq!(
            store.switch().paused().await.unwrap(),
            None,
            "{name}: never recorded"
        );
        assert_eq!(store.orders().count_live("old").await.unwrap(), 1, "{name}");
        // A cancelled order of that release never had its item returned.
        let unreleased: Vec<String> = store
            .orders()
            .unreleased_cancelled("", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.reservation_id)
            .collect();
        assert_eq!(unreleased, vec!["old.r2".to_owned()], "{name}");

        assert_eq!(
            db.migrations().await,
            vec![(1, true), (10, true), (20, true), (30, true), (40, true)],
            "{name}"
        );
        assert_eq!(db.schema().await, fresh_schema(&db).await, "{name}");

        // What the added columns and table serve works.
        let order = store
            .orders()
            .by_reservation("old.r2")
            .await
            .unwrap()
            .unwrap();
        store
            .orders()
            .mark_released(&order.order_id, 1)
            .await
            .unwrap();
        assert!(
            store
                .orders()
                .unreleased_cancelled("", 10)
                .await
                .unwrap()
                .is_empty(),
            "{name}"
        );
        store.switch().set_paused(true).await.unwrap();
        assert_eq!(store.switch().paused().await.unwrap(), Some(true), "{name}");
        assert!(
            store.sales().adopt_paused("old", true).await.unwrap(),
            "{name}"
        );
        assert_eq!(
            store
                .orders()
                .insert(&[reservation("old", "carol")])
                .await
                .unwrap(),
            1,
            "{name}"
        );
        store.close().await;

        let store = Store::connect(&db.url).await.unwrap();
        assert_eq!(
            store.sales().paused("old").await.unwrap(),
            Some(true),
            "{name}"
        );
        store.close().await;
        db.drop().await;
    }
}
