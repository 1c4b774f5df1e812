//! Asynchronous calls (ProFaaStinate §3): the front end that accepts, stores, answers
//! status lookups and releases them, the durable store behind it, and the CPU signals
//! that the delay queue's scheduler reads.
//!
//! | module | role |
//! |---|---|
//! | [`front`] | accept (`202`), status URLs, release through the attempt protocol, purge |
//! | [`store`] | the durable store of asynchronous calls (committed before the `202`) |
//! | [`secrets`] | stored calls' credential headers, sealed (never plain text) |
//! | [`cpu`] | the delay queue's `prometheus` CPU signal: a Prometheus query or node_exporter scrapes |

pub mod cpu;
pub mod front;
pub mod secrets;
pub mod store;
