//! Rebuilds the backend when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and a proc macro cannot tell Cargo
//! to watch a directory.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
