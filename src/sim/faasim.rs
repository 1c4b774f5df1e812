//! FaaSim's synthetic workloads (FaaSim, JoCC 2023; papers.md §2), made by a seeded
//! generator: `events` traces (`<arrival seconds> <zone>` lines) of the same shape as the
//! FaaSim simulator's `burst` and `stream` files (`tests/data/faasim/` holds excerpts of
//! the originals):
//! * [`burst`]: one burst of 100 calls — 20 per zone at uniform times within 2 s — played
//!   every 30 s, 100 times (10 000 calls over 5 zones);
//! * [`stream`]: 100 calls/s for 100 s — 2000 per zone at uniform times — merged in time
//!   order.
//!
//! Equal seeds give equal traces (ChaCha8).

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Zones of both workloads.
pub const ZONES: u32 = 5;

/// The burst workload: `(arrival seconds, zone)` in time order.
pub fn burst(seed: u64) -> Vec<(f64, u32)> {
    const BURSTS: u32 = 100;
    const PER_ZONE: u32 = 20;
    const SPREAD_S: f64 = 2.0;
    const PERIOD_S: f64 = 30.0;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut one: Vec<(f64, u32)> = (0..ZONES)
        .flat_map(|z| (0..PER_ZONE).map(move |_| z))
        .map(|z| (rng.random_range(0.0..SPREAD_S), z))
        .collect();
    one.sort_by(|a, b| a.0.total_cmp(&b.0));
    (0..BURSTS)
        .flat_map(|b| {
            one.iter()
                .map(move |&(t, z)| (f64::from(b) * PERIOD_S + t, z))
        })
        .collect()
}

/// The stream workload: `(arrival seconds, zone)` in time order.
pub fn stream(seed: u64) -> Vec<(f64, u32)> {
    const PER_ZONE: u32 = 2000;
    const DURATION_S: f64 = 100.0;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut all: Vec<(f64, u32)> = (0..ZONES)
        .flat_map(|z| (0..PER_ZONE).map(move |_| z))
        .map(|z| (rng.random_range(0.0..DURATION_S), z))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all
}

/// `events` trace text: one `<arrival seconds> <zone>` line per call.
pub fn events_text(calls: &[(f64, u32)]) -> String {
    calls.iter().map(|(t, z)| format!("{t:.9} {z}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape the FaaSim originals have (checked against them when present).
    fn shape(calls: &[(f64, u32)]) -> (usize, [usize; 5], f64) {
        let mut per_zone = [0usize; 5];
        for (_, z) in calls {
            per_zone[*z as usize] += 1;
        }
        (calls.len(), per_zone, calls.last().unwrap().0)
    }

    #[test]
    fn burst_and_stream_have_faasims_shape_and_are_seeded() {
        let b = burst(7);
        let (n, per_zone, last) = shape(&b);
        assert_eq!((n, per_zone), (10_000, [2000; 5]));
        assert!(b.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!((99.0 * 30.0..99.0 * 30.0 + 2.0).contains(&last));
        // Every burst: 100 calls within 2 s of its start, 20 per zone.
        for k in 0..100 {
            let burst: Vec<_> = b[k * 100..(k + 1) * 100].to_vec();
            let start = k as f64 * 30.0;
            assert!(burst.iter().all(|(t, _)| (start..start + 2.0).contains(t)));
            assert_eq!(shape(&burst).1, [20; 5]);
        }
        let s = stream(7);
        let (n, per_zone, last) = shape(&s);
        assert_eq!((n, per_zone), (10_000, [2000; 5]));
        assert!(last < 100.0 && s.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(burst(7), b, "seeded");
        assert_ne!(burst(8), b);
        let text = events_text(&s[..2]);
        assert_eq!(text.lines().count(), 2);
        // The originals sit in the shared folder next to the checkout (or its worktree).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for name in ["burst", "stream"] {
            let Some(text) = ["../shared", "../../shared"].iter().find_map(|d| {
                std::fs::read_to_string(root.join(format!("{d}/traces/faasim/{name}.txt"))).ok()
            }) else {
                continue;
            };
            let calls: Vec<(f64, u32)> = text
                .lines()
                .map(|l| {
                    let mut it = l.split_whitespace();
                    (
                        it.next().unwrap().parse().unwrap(),
                        it.next().unwrap().parse().unwrap(),
                    )
                })
                .collect();
            let ours = if name == "burst" { burst(1) } else { stream(1) };
            let (a, b) = (shape(&calls), shape(&ours));
            assert_eq!((a.0, a.1), (b.0, b.1), "{name}");
            assert!(
                (a.2 - b.2).abs() < 1.0,
                "{name}: ends at {} vs {}",
                a.2,
                b.2
            );
        }
    }
}
