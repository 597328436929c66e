//! The schema: one directory of sqlx migrations per database flavour under
//! `backend/migrations/`, embedded in the binary and run by
//! [`Store::connect`](super::Store::connect).
//!
//! Databases made before migrations existed have their tables but no
//! `_sqlx_migrations` table. The first migration of each flavour is the
//! schema of the last such release, written so it applies on top of one
//! (`CREATE ... IF NOT EXISTS`), which adopts it. Releases before that one
//! lack some columns: PostgreSQL migrations add them with
//! `ADD COLUMN IF NOT EXISTS`; SQLite has no such statement, so
//! [`adopt_sqlite`] adds them before the migrations run, once, on a database
//! no migration has touched yet. MySQL (and MariaDB) came later: its first
//! migration is the schema of the release that brought it, with no database
//! from before migrations to adopt.
//!
//! Migration versions are shared across flavours: version N means the same
//! change in every directory (`0020_order_events.sql` is the order events
//! outbox everywhere).
//!
//! Migrations must be additive (new tables, new nullable or defaulted
//! columns), because during a rolling upgrade backends of the old release
//! keep running on the migrated database; for the same reason a backend
//! accepts a database with migrations newer than its own.

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{AnyConnection, AnyPool, Row};

/// The database kinds the store runs on; each has its own migrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Sqlite,
    Postgres,
    /// MySQL 8 or MariaDB 10.6 and later (`mysql://` URLs).
    Mysql,
}

impl Flavour {
    /// The flavour of a `sqlite:...`, `mysql://...` or `postgres://...` URL.
    /// Any other URL is taken for PostgreSQL, whose driver then says what
    /// is wrong with it.
    pub fn of(database_url: &str) -> Self {
        if database_url.starts_with("sqlite:") {
            Flavour::Sqlite
        } else if database_url.starts_with("mysql:") {
            Flavour::Mysql
        } else {
            Flavour::Postgres
        }
    }

    fn migrator(self) -> &'static Migrator {
        match self {
            Flavour::Sqlite => &SQLITE,
            Flavour::Postgres => &POSTGRES,
            Flavour::Mysql => &MYSQL,
        }
    }
}

/// `ignore_missing`: a database migrated by a newer release still serves
/// this one (see the module doc).
static SQLITE: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("migrations/sqlite")
};
static POSTGRES: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("migrations/postgres")
};
static MYSQL: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("migrations/mysql")
};

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("cannot adopt a database made before migrations: {0}")]
    Adopt(#[source] sqlx::Error),
    #[error("cannot migrate the database: {0}")]
    Migrate(#[source] MigrateError),
}

/// Brings the database behind `pool` up to the newest migration of its
/// flavour, adopting one made before migrations (see the module doc).
/// Safe with several processes: sqlx serialises PostgreSQL and MySQL
/// migrations with an advisory lock (`pg_advisory_lock`, `GET_LOCK`); on SQLite a process that loses a race fails and the
/// caller's retry finds the work done.
///
/// # Errors
/// A statement failed, or the database holds a migration whose text
/// differs from this release's.
pub async fn migrate(pool: &AnyPool, flavour: Flavour) -> Result<(), SchemaError> {
    if flavour == Flavour::Sqlite {
        let mut conn = pool.acquire().await.map_err(SchemaError::Adopt)?;
        adopt_sqlite(&mut conn).await.map_err(SchemaError::Adopt)?;
    }
    flavour
        .migrator()
        .run(pool)
        .await
        .map_err(SchemaError::Migrate)
}

/// Columns added by hand after the first release, before migrations, as
/// (table, column, definition). Frozen: later schema changes are migrations.
const COLUMNS_ADDED_BEFORE_MIGRATIONS: &[(&str, &str, &str)] = &[
    (
        "sales",
        "payment_timeout_seconds",
        "BIGINT NOT NULL DEFAULT 900",
    ),
    ("orders", "released_at_ms", "BIGINT"),
    ("sales", "paused", "BIGINT"),
];

/// Adds the columns of [`COLUMNS_ADDED_BEFORE_MIGRATIONS`] that the tables
/// of a SQLite database made before migrations lack, so the first
/// migration finds the schema it declares. Does nothing on a database
/// migrations have run on, or to a table that does not exist yet (the
/// first migration creates it whole).
async fn adopt_sqlite(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    let migrated: i64 = sqlx::query(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    if migrated > 0 {
        return Ok(());
    }
    for (table, column, definition) in COLUMNS_ADDED_BEFORE_MIGRATIONS {
        let columns: Vec<String> = sqlx::query("SELECT name FROM pragma_table_info($1)")
            .bind(*table)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        if !columns.is_empty() && !columns.iter().any(|c| c == column) {
            sqlx::query(&format!(
                "ALTER TABLE {table} ADD COLUMN {column} {definition}"
            ))
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// A short name for the migrations of `flavour` this build embeds: equal
/// for equal migrations, different when one is added or changed.
#[cfg(test)]
pub(crate) fn fingerprint(flavour: Flavour) -> String {
    let mut folded = [0_u8; 6];
    for migration in flavour.migrator().iter() {
        for (i, byte) in migration
            .version
            .to_le_bytes()
            .iter()
            .chain(migration.checksum.iter())
            .enumerate()
        {
            folded[i % folded.len()] = folded[i % folded.len()].rotate_left(3) ^ byte;
        }
    }
    folded.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::Flavour;

    /// Every released migration, with the SHA-384 sqlx records for it. A
    /// database records these when migrated; a migration edited after its
    /// release no longer matches and sqlx refuses to start on that
    /// database. Change the schema with a new migration, and add it here.
    const RELEASED: [(Flavour, i64, &str); 12] = [
        (Flavour::Sqlite, 1, "7d6d00ea98fffefdcac48871128528e3ed19b1de2c1f3c021cde9bd6540432bdb847de154f04abbdc9d6abacdef34c2b"),
        (Flavour::Postgres, 1, "cd0e16000e22cecf975de9dc1f0be5770a9f96bbff806d292cd75dbc6b2a22afa0ed7ae3080af1f3c7a927b63bb0efce"),
        (Flavour::Mysql, 1, "2de7d9126c8633f100f8dd75b55cf377d9eb3ee1c79642e8c602a26037604c13fd0e9511e1220a95d93c987bcaf4c838"),
        (Flavour::Sqlite, 10, "116846eb06ddd1dca4722a000a00d43a71f85ed1499d6a5da333d1adf411ffba29a6dfc1e6b3e48e973880b5c941effb"),
        (Flavour::Postgres, 10, "116846eb06ddd1dca4722a000a00d43a71f85ed1499d6a5da333d1adf411ffba29a6dfc1e6b3e48e973880b5c941effb"),
        (Flavour::Mysql, 10, "116846eb06ddd1dca4722a000a00d43a71f85ed1499d6a5da333d1adf411ffba29a6dfc1e6b3e48e973880b5c941effb"),
        (Flavour::Sqlite, 20, "36bfc66e4be2d5fe7eea832ff1de4ac5491c516cb8a7596102820e04576402cf36fcd1fc931100428112e3300f9969ee"),
        (Flavour::Postgres, 20, "36bfc66e4be2d5fe7eea832ff1de4ac5491c516cb8a7596102820e04576402cf36fcd1fc931100428112e3300f9969ee"),
        (Flavour::Mysql, 20, "8ad69cf325350e795e7a083866b1dc458dc09be8c741da5a5fec58561f04f999145cea91e534fdef2ed2276e739bc3a1"),
        (Flavour::Sqlite, 30, "a9aedcd196c30a2aded06f62f406df119ce09ca971ed6adf7303b52f388675a14372750918ef3ae47bf41abac98de986"),
        (Flavour::Postgres, 30, "a9aedcd196c30a2aded06f62f406df119ce09ca971ed6adf7303b52f388675a14372750918ef3ae47bf41abac98de986"),
        (Flavour::Mysql, 30, "a9aedcd196c30a2aded06f62f406df119ce09ca971ed6adf7303b52f388675a14372750918ef3ae47bf41abac98de986"),
    ];

    #[test]
    fn released_migrations_are_never_edited() {
        for (flavour, version, checksum) in RELEASED {
            let migration = flavour
                .migrator()
                .iter()
                .find(|m| m.version == version)
                .unwrap_or_else(|| panic!("{flavour:?} migration {version} is gone"));
            let hex: String = migration
                .checksum
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(hex, checksum, "{flavour:?} migration {version} was edited after its release: add a new migration instead");
        }
    }
}
