//! Turning each sale's Redis Stream of reservations into orders.

pub mod consumer;
pub mod dead_letter;
pub mod entry;
pub mod retention;
