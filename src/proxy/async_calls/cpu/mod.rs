//! The delay queue's `prometheus` CPU signal (ProFaaStinate §3): the VM pool's CPU
//! utilisation, a share in `[0, 1]`, read in the background so that the scheduler's
//! sample never waits on the network.
//!
//! | module | role |
//! |---|---|
//! | [`prometheus`] | the signal from a Prometheus server's query API (`async.prometheus.url`) |
//! | [`error`] | why a signal gave no utilisation, shared by both forms |
//! | [`node_exporter`] | the same signal scraped from node_exporter on every VM host (`async.prometheus.node_exporter_port`) |

pub mod error;
pub mod node_exporter;
pub mod prometheus;
