//! Test support: a real `redis-server` of the test's own (the one in
//! `flashgate-testkit`, on a port no other test holds), killed when dropped.

pub use flashgate_testkit::RedisServer;
