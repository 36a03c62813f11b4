//! The Redis tier's tests in one binary: one link and one optimized copy
//! of the near cache's code for all of them, where a binary per file built
//! it eleven times. Each file is a module and its tests are named by it
//! (`cargo test -p expiremap-redis --test integration -- leases::`); every
//! test starts the `redis-server` processes it needs on free loopback ports.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod async_api;
mod cluster;
mod cluster_topology;
mod coherence;
mod edges;
mod expirations;
mod faults;
mod hostile_values;
mod leases;
mod metrics;
mod migration;
mod tls;
mod tracing;
mod user_code;
