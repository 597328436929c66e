//! Buy rules against a real redis-server.
