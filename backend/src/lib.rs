//! Flashgate order backend.
pub mod store;
#[cfg(test)]
pub(crate) mod testing;
