//! Redis Cluster: a real three-primary cluster on loopback ports.

mod common;

use common::cluster::Cluster;
use expiremap_redis::{Error, NearCache};

#[test]
fn plain_builder_refuses_a_cluster_node_at_build() {
    let c = Cluster::start(3);
    let r = NearCache::<String, u64>::builder(c.url(0))
        .prefix("c:")
        .build();
    match r {
        Err(Error::Config(m)) => assert!(m.contains("Redis Cluster"), "{m}"),
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("built a single-server cache on a cluster node"),
    }
}
