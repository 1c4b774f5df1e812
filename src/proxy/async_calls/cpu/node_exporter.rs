//! The node_exporter form of the `prometheus` CPU signal (ProFaaStinate §3):
//! with `async.prometheus.node_exporter_port`, the gateway scrapes
//! `http://<ready VM's host>:<port>/metrics` itself (no Prometheus server) once per
//! `async.sample_interval_seconds`.
//!
//! node_exporter's `node_cpu_seconds_total{cpu, mode}` are counters (seconds each CPU
//! spent in each mode since boot). One host's utilisation over an interval is
//! `1 − Δidle / Δtotal` between two scrapes, where `idle` sums the `mode="idle"` series
//! and `total` every mode, over all CPUs (the same share as the server mode's default
//! query `1 - avg(rate(node_cpu_seconds_total{mode="idle"}[…]))`). A host's first
//! scrape, or one after its counters went back (a reboot), only sets the baseline: the
//! host counts from its second scrape on. VMs sharing a host share its node_exporter,
//! so each distinct host is scraped once. The pool's signal is the mean over the hosts
//! with a utilisation this round.

use std::collections::HashMap;

use http::Uri;
use prometheus_parse::{Scrape, Value};

use super::error::PrometheusError;

/// One scrape's CPU counters of one host, summed over its CPUs, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuCounters {
    /// Σ `node_cpu_seconds_total{mode="idle"}`.
    pub idle: f64,
    /// Σ `node_cpu_seconds_total` over every mode.
    pub total: f64,
}

/// The CPU counters in a node_exporter `/metrics` body (the Prometheus text exposition
/// format, parsed by `prometheus-parse`).
///
/// # Errors
/// [`PrometheusError::NoCpuCounters`] without a `node_cpu_seconds_total` sample (not a
/// node_exporter, or its `cpu` collector is off); [`PrometheusError::NotANumber`] for a
/// negative or non-finite counter, or a sample without a `mode` label.
pub fn parse_cpu_counters(body: &str) -> Result<CpuCounters, PrometheusError> {
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .map_err(|e| PrometheusError::NotExposition(e.to_string()))?;
    let mut c = CpuCounters {
        idle: 0.0,
        total: 0.0,
    };
    let mut samples = 0usize;
    for s in scrape
        .samples
        .iter()
        .filter(|s| s.metric == "node_cpu_seconds_total")
    {
        let (Value::Counter(v) | Value::Untyped(v) | Value::Gauge(v)) = s.value else {
            continue;
        };
        if !v.is_finite() || v < 0.0 {
            return Err(PrometheusError::NotANumber(format!(
                "node_cpu_seconds_total {v}"
            )));
        }
        let Some(mode) = s.labels.get("mode") else {
            return Err(PrometheusError::NotANumber(
                "node_cpu_seconds_total without a mode label".into(),
            ));
        };
        c.total += v;
        if mode == "idle" {
            c.idle += v;
        }
        samples += 1;
    }
    if samples == 0 {
        return Err(PrometheusError::NoCpuCounters);
    }
    Ok(c)
}

/// The utilisation between two scrapes of one host, `1 − Δidle/Δtotal` in [0, 1];
/// `None` when the counters went back (a reboot or a new exporter: `now` is the new
/// baseline) or did not move (no time passed between the scrapes).
pub fn utilisation(prev: CpuCounters, now: CpuCounters) -> Option<f64> {
    let total = now.total - prev.total;
    let idle = now.idle - prev.idle;
    if total <= 0.0 || idle < 0.0 || now.total < prev.total {
        return None;
    }
    Some((1.0 - idle / total).clamp(0.0, 1.0))
}

/// The `/metrics` URL of the node_exporter on each distinct host of `vm_bases`, sorted.
pub fn exporter_urls(vm_bases: &[Uri], port: u16) -> Vec<String> {
    let mut urls: Vec<String> = vm_bases
        .iter()
        .filter_map(|b| b.host())
        .map(|h| {
            if h.contains(':') && !h.starts_with('[') {
                format!("http://[{h}]:{port}/metrics")
            } else {
                format!("http://{h}:{port}/metrics")
            }
        })
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

#[derive(Debug, Default)]
struct Host {
    /// The last scrape's counters (kept through an outage: a later delta is still valid).
    counters: Option<CpuCounters>,
    /// The last utilisation (reused while the counters did not move).
    utilisation: Option<f64>,
    /// The current outage's reason.
    error: Option<PrometheusError>,
}

/// What one round of scrapes gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The mean utilisation over the hosts that answered with a second scrape; `None`
    /// while there is none (the `outstanding` signal stands in).
    pub value: Option<f64>,
    /// The first host failing this round, by URL (for `/status`).
    pub error: Option<PrometheusError>,
}

/// Every host's scrape state. See the [module docs](self).
#[derive(Debug, Default)]
pub struct NodeExporters {
    hosts: HashMap<String, Host>,
}

impl NodeExporters {
    /// Fold one round's outcomes (one per exporter URL): log **one** warning when a
    /// host's outage starts (naming its URL and the reason) and a line when it answers
    /// again; forget hosts no longer scraped (their VMs left the pool).
    pub fn record(
        &mut self,
        outcomes: Vec<(String, Result<CpuCounters, PrometheusError>)>,
    ) -> Round {
        self.hosts
            .retain(|url, _| outcomes.iter().any(|(u, _)| u == url));
        let mut sum = 0.0;
        let mut n = 0usize;
        let mut first_error = None;
        for (url, outcome) in outcomes {
            let host = self.hosts.entry(url.clone()).or_default();
            match outcome {
                Ok(now) => {
                    if host.error.take().is_some() {
                        tracing::info!(url = %url, "node_exporter CPU signal answers again");
                    }
                    host.utilisation = match host.counters {
                        Some(prev) if now == prev => host.utilisation,
                        Some(prev) => utilisation(prev, now),
                        None => None,
                    };
                    host.counters = Some(now);
                    if let Some(u) = host.utilisation {
                        sum += u;
                        n += 1;
                    }
                }
                Err(e) => {
                    if host.error.is_none() {
                        tracing::warn!(
                            url = %url,
                            error = %e,
                            "node_exporter CPU signal failed; this VM host is left out of the \
                             pool's mean (the outstanding signal stands in when no host answers)"
                        );
                    }
                    host.utilisation = None;
                    if first_error.is_none() {
                        first_error = Some(PrometheusError::At {
                            url: url.clone(),
                            reason: Box::new(e.clone()),
                        });
                    }
                    host.error = Some(e);
                }
            }
        }
        Round {
            value: (n > 0).then(|| sum / n as f64),
            error: first_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter's exposition for two CPUs with the given (idle, user, system)
    /// seconds each.
    fn exposition(cpus: &[(f64, f64, f64)]) -> String {
        let mut s = String::from(
            "# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.\n\
             # TYPE node_cpu_seconds_total counter\n",
        );
        for (i, (idle, user, system)) in cpus.iter().enumerate() {
            s += &format!("node_cpu_seconds_total{{cpu=\"{i}\",mode=\"idle\"}} {idle}\n");
            s += &format!("node_cpu_seconds_total{{cpu=\"{i}\",mode=\"user\"}} {user}\n");
            s += &format!("node_cpu_seconds_total{{cpu=\"{i}\",mode=\"system\"}} {system}\n");
        }
        s += "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.37\n";
        s
    }

    #[test]
    fn counters_sum_idle_and_every_mode_over_the_cpus() {
        let c = parse_cpu_counters(&exposition(&[(1000.5, 200.25, 40.0), (900.0, 310.0, 55.5)]))
            .unwrap();
        assert_eq!(c.idle, 1000.5 + 900.0);
        assert_eq!(c.total, 1000.5 + 200.25 + 40.0 + 900.0 + 310.0 + 55.5);
        // Scientific notation (node_exporter prints large counters so).
        let c = parse_cpu_counters(
            "node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 1.5e+06\n\
             node_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 2.5e+05\n",
        )
        .unwrap();
        assert_eq!((c.idle, c.total), (1.5e6, 1.75e6));
    }

    #[test]
    fn a_body_without_cpu_counters_says_so() {
        for body in ["<html>hello</html>", "node_load1 0.5\n", ""] {
            let e = parse_cpu_counters(body).unwrap_err();
            assert_eq!(e, PrometheusError::NoCpuCounters, "{body:?}");
            assert!(e.to_string().contains("node_cpu_seconds_total"), "{e}");
        }
    }

    #[test]
    fn utilisation_is_one_minus_idle_share_of_the_interval() {
        let a = CpuCounters {
            idle: 1900.5,
            total: 2505.75,
        };
        // 2 CPUs × 3 s: 1.2 s idle of 6 s → 0.8 busy.
        let b = CpuCounters {
            idle: a.idle + 1.2,
            total: a.total + 6.0,
        };
        let u = utilisation(a, b).unwrap();
        assert!((u - (1.0 - 1.2 / 6.0)).abs() < 1e-9, "{u}");
        // A reboot: the counters went back, no utilisation until the next scrape.
        let rebooted = CpuCounters {
            idle: 3.0,
            total: 4.5,
        };
        assert_eq!(utilisation(b, rebooted), None);
        assert_eq!(utilisation(b, b), None, "no time passed");
    }

    #[test]
    fn the_pool_is_the_mean_of_hosts_with_two_scrapes_and_failures_are_left_out() {
        let mut ne = NodeExporters::default();
        let (h1, h2) = (
            "http://10.0.0.1:9100/metrics",
            "http://10.0.0.2:9100/metrics",
        );
        let c = |idle, total| CpuCounters { idle, total };
        let r = ne.record(vec![
            (h1.into(), Ok(c(100.0, 200.0))),
            (h2.into(), Ok(c(50.0, 60.0))),
        ]);
        assert_eq!(r.value, None, "first scrape: baselines only");
        // h1: 0.3 s idle of 4 s → 0.925; h2: 3.1 s idle of 4 s → 0.225.
        let r = ne.record(vec![
            (h1.into(), Ok(c(100.3, 204.0))),
            (h2.into(), Ok(c(53.1, 64.0))),
        ]);
        let want = ((1.0 - 0.3 / 4.0) + (1.0 - 3.1 / 4.0)) / 2.0;
        assert!((r.value.unwrap() - want).abs() < 1e-9, "{r:?}");
        assert_eq!(r.error, None);
        // h2 fails: the mean is h1's alone, the error names h2's URL.
        let r = ne.record(vec![
            (h1.into(), Ok(c(100.8, 206.0))),
            (h2.into(), Err(PrometheusError::Status(503))),
        ]);
        let want = 1.0 - 0.5 / 2.0;
        assert!((r.value.unwrap() - want).abs() < 1e-9, "{r:?}");
        let e = r.error.unwrap().to_string();
        assert!(e.starts_with(h2) && e.contains("HTTP status 503"), "{e}");
        // Every host fails: no value (outstanding stands in).
        let r = ne.record(vec![(h1.into(), Err(PrometheusError::NoCpuCounters))]);
        assert_eq!(r.value, None);
    }

    #[test]
    fn each_host_is_scraped_once() {
        let bases: Vec<Uri> = [
            "http://127.0.0.1:41001/",
            "http://127.0.0.1:41002/",
            "http://10.0.0.7:8080",
            "http://[::1]:8080",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(
            exporter_urls(&bases, 9137),
            vec![
                "http://10.0.0.7:9137/metrics",
                "http://127.0.0.1:9137/metrics",
                "http://[::1]:9137/metrics",
            ]
        );
    }
}
