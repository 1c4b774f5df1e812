//! Unit tests of the policy core's public functions, written against the mutants
//! cargo-mutants found uncaught (issue 19, `scripts/mutants.sh`). Every expectation is
//! computed here from the formula in the module's docs, with asymmetric parameters, so
//! a swapped operator or a constant body changes the answer.
//!
//! The modules are named `policy::<file>` so the mutation run's test filter (`policy::`)
//! picks them up.

mod policy {
    mod cost {
        use std::time::Duration;

        use spillway::policy::cost::{
            Architecture, DEFAULT_LAMBDA_ARM64_GB_SECOND_USD, DEFAULT_LAMBDA_REQUEST_USD,
            FunctionPricing, faas_cost_per_second, hybrid_cost_per_second, iaas_cost_per_second,
        };

        fn close(a: f64, b: f64) -> bool {
            (a - b).abs() <= 1e-12 * b.abs().max(1e-12)
        }

        /// LIBRA §II: billed GB-seconds are memory (GB, 1 GB = 1024 MB) times the duration
        /// rounded up to the millisecond.
        #[test]
        fn gb_seconds_are_memory_in_gb_times_billed_seconds() {
            // 1536 MB for 2.5004 s bills 2.501 s: 1.5 GB · 2.501 s.
            let gbs = FunctionPricing::gb_seconds(1536, Duration::from_micros(2_500_400));
            assert!(close(gbs, 1.5 * 2.501), "{gbs}");
            // 256 MB for exactly 40 ms: 0.25 GB · 0.040 s.
            let gbs = FunctionPricing::gb_seconds(256, Duration::from_millis(40));
            assert!(close(gbs, 0.25 * 0.040), "{gbs}");
        }

        /// The arm64 price is the arm64 list price; one call costs compute + request fee
        /// + API-gateway fee, each counted once.
        #[test]
        fn arm64_call_cost_adds_each_fee_once() {
            let p = FunctionPricing::lambda(Architecture::Arm64);
            assert_eq!(p.gb_second_usd, DEFAULT_LAMBDA_ARM64_GB_SECOND_USD);
            assert_eq!(p.request_usd, DEFAULT_LAMBDA_REQUEST_USD);
            assert_eq!(p.api_gateway_request_usd, 0.0);
            let p = FunctionPricing {
                gb_second_usd: 3e-5,
                request_usd: 7e-7,
                api_gateway_request_usd: 2e-6,
            };
            // 2048 MB for 300 ms: 2 GB · 0.3 s = 0.6 GB-s.
            let c = p.cost_per_request(2048, Duration::from_millis(300));
            assert!(close(c, 0.6 * 3e-5 + 7e-7 + 2e-6), "{c}");
        }

        /// FaaS cost per second: rate × cost per call.
        #[test]
        fn faas_cost_is_rate_times_call_cost() {
            let c = faas_cost_per_second(7.0, 3e-6);
            assert!(close(c, 2.1e-5), "{c}");
            assert_eq!(faas_cost_per_second(0.0, 3e-6), 0.0);
        }

        /// IaaS cost per second: ceil(N / r_max) whole VMs at the hourly price / 3600.
        #[test]
        fn iaas_cost_pays_for_whole_vms() {
            let hourly = 0.10;
            // 33 req/s at 16 per VM needs 3 VMs (2 are full, the third holds 1 req/s).
            let c = iaas_cost_per_second(33.0, 16.0, hourly);
            assert!(close(c, 3.0 * hourly / 3600.0), "{c}");
            // Exactly full: 32 req/s is 2 VMs.
            let c = iaas_cost_per_second(32.0, 16.0, hourly);
            assert!(close(c, 2.0 * hourly / 3600.0), "{c}");
            assert_eq!(iaas_cost_per_second(0.0, 16.0, hourly), 0.0);
        }

        /// Hybrid cost (LIBRA's split): the full VMs plus the remainder on functions, the
        /// remainder costing at most one more VM.
        #[test]
        fn hybrid_cost_is_full_vms_plus_the_cheaper_of_functions_and_one_vm() {
            let hourly = 0.10;
            let vm_s = hourly / 3600.0;
            // 37 req/s, r_max 16: 2 full VMs and 5 req/s left over.
            // Cheap calls: 5 · 2e-6 = 1e-5 USD/s < one VM (2.78e-5 USD/s).
            let c = hybrid_cost_per_second(37.0, 16.0, hourly, 2e-6);
            assert!(close(c, 2.0 * vm_s + 5.0 * 2e-6), "{c}");
            // Dear calls: 5 · 1e-5 = 5e-5 USD/s > one VM, so a third VM is cheaper.
            let c = hybrid_cost_per_second(37.0, 16.0, hourly, 1e-5);
            assert!(close(c, 3.0 * vm_s), "{c}");
            // Below one VM's capacity: all on functions.
            let c = hybrid_cost_per_second(3.0, 16.0, hourly, 2e-6);
            assert!(close(c, 3.0 * 2e-6), "{c}");
        }
    }
}
