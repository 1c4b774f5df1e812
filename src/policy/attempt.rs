//! The request attempt protocol: the decisions a request goes through, from its first
//! routing decision to the attempt that answers it. Both drivers (the gateway's request
//! path and the simulator) run it through [`Core::route`](super::core::Core::route) and
//! [`Core::on_attempt_failed`](super::core::Core::on_attempt_failed).
//!
//! Outcomes ([`Decision`] with its [`AttemptKind`]):
//!
//! | outcome | when |
//! |---|---|
//! | `Vm` (first) | the balancer admits the request to a ready VM (LIBRA §III-C) |
//! | `Function{zone}` (first) | the balancer spills it and a zone has capacity (FaaSim placement) |
//! | `Retry` | a VM attempt failed before anything was sent (connect failure): once, on another VM or the function tier, whatever the retry budget (no upstream did work for it); or an idempotent request without a body failed before any response byte: once, elsewhere (http-cases C17), within the retry budget ([`super::retry`]) |
//! | `FallThrough` | a function attempt was not run (zone unreachable, cold start failed, instance gone, never ran): the next zone |
//! | `FallBack` | no zone can run it (full, throttled, unreachable): a VM with a free slot |
//! | `Queue` | nothing is free: wait in the gateway queue (call scheduling) |
//! | `Reject` | nothing is free and nothing may wait: 503 |
//!
//! Order after a failed function attempt: the next zone, then a VM slot, then the queue,
//! then 503. A request that reached an upstream is retried only when it is idempotent,
//! the driver can send it again and no response byte arrived; non-idempotent requests are
//! never sent twice.

use super::VmId;
use super::balancer::{RequestMeta, RouteReason};
use super::placement::{Lease, ZoneId, ZoneSet};
use super::routes::KeyId;
use super::sched::{Arrival, QueueId};

/// Which attempt of a request a [`Decision`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptKind {
    /// The first routing decision (counted by the traffic monitor).
    First,
    /// Again after a failed VM attempt (another VM, or the function tier).
    Retry,
    /// The next function zone after a zone could not run the call.
    FallThrough,
    /// A VM after no function zone could run the call.
    FallBack,
    /// A call that waited in the gateway queue, served when a VM slot or function
    /// capacity freed (call scheduling §4).
    Dequeued,
}

impl AttemptKind {
    /// Label for metrics and logs: `first`, `retry`, `fall_through`, `fall_back`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::First => "first",
            AttemptKind::Retry => "retry",
            AttemptKind::FallThrough => "fall_through",
            AttemptKind::FallBack => "fall_back",
            AttemptKind::Dequeued => "dequeued",
        }
    }
}

/// What to do with a request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Decision {
    /// Send it to VM `vm`; report the end with
    /// [`Core::on_vm_request_finished`](super::core::Core::on_vm_request_finished) or a
    /// failure with [`Core::on_attempt_failed`](super::core::Core::on_attempt_failed).
    Vm {
        /// The VM.
        vm: VmId,
        /// Which attempt.
        kind: AttemptKind,
        /// Why this VM was chosen (balancer reason).
        reason: RouteReason,
    },
    /// Run it in a function zone under `lease`; a [`Start::Cold`](super::placement::Start)
    /// lease needs its instance started first. Report the end with
    /// [`Core::on_function_finished`](super::core::Core::on_function_finished).
    Function {
        /// The zone, instance and start kind.
        lease: Lease,
        /// Which attempt.
        kind: AttemptKind,
        /// Why it left the VMs (balancer reason).
        reason: RouteReason,
    },
    /// Wait in the gateway queue until a slot frees (call scheduling).
    Queue {
        /// Why nothing was free.
        reason: RouteReason,
    },
    /// Answer 503 with `Retry-After`.
    Reject {
        /// Why.
        reason: RouteReason,
    },
}

impl Decision {
    /// The reason of any variant.
    pub fn reason(&self) -> RouteReason {
        match *self {
            Decision::Vm { reason, .. }
            | Decision::Function { reason, .. }
            | Decision::Queue { reason }
            | Decision::Reject { reason } => reason,
        }
    }

    /// The attempt kind, for `Vm` and `Function`.
    pub fn kind(&self) -> Option<AttemptKind> {
        match *self {
            Decision::Vm { kind, .. } | Decision::Function { kind, .. } => Some(kind),
            Decision::Queue { .. } | Decision::Reject { .. } => None,
        }
    }
}

/// Why an attempt did not reach the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotSentReason {
    /// The VM refused the connection.
    ConnectFailed,
    /// The function endpoint refused the call for capacity (HTTP 429, Lambda
    /// `TooManyRequestsException`).
    Throttled,
    /// A new function instance failed to start (spawn failure, readiness timeout).
    ColdStartFailed,
    /// The warm instance chosen for the call had died meanwhile: place the call again in
    /// the same zone.
    InstanceGone,
    /// The function zone cannot be reached (connect failure, endpoint down).
    Unreachable,
    /// The provider reports that the function never ran (Lambda `ResourceNotReady`,
    /// ENI or KMS errors…).
    NeverRan,
    /// The backend is shutting down.
    ShuttingDown,
}

impl NotSentReason {
    /// Label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            NotSentReason::ConnectFailed => "connect_failed",
            NotSentReason::Throttled => "throttled",
            NotSentReason::ColdStartFailed => "cold_start_failed",
            NotSentReason::InstanceGone => "instance_gone",
            NotSentReason::Unreachable => "unreachable",
            NotSentReason::NeverRan => "never_ran",
            NotSentReason::ShuttingDown => "shutting_down",
        }
    }
}

/// How an attempt failed, as the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing of the request reached the upstream.
    NotSent {
        /// Why.
        reason: NotSentReason,
        /// The driver still holds the request (or can rebuild it exactly) and can send it
        /// again.
        request_available: bool,
    },
    /// The request (or part of it) reached the upstream before the attempt failed.
    FailedAfterSend {
        /// A byte of the response arrived (then nothing is ever retried).
        response_started: bool,
        /// The driver can send the request again (an idempotent request without a body).
        request_available: bool,
    },
}

/// Most re-placements in the same zone after [`NotSentReason::InstanceGone`].
pub const MAX_INSTANCE_GONE: u8 = 3;

/// What the current attempt holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holding {
    Vm(VmId),
    Function(Lease),
}

/// One request's journey through the protocol: what it is, where it may still go, what
/// its current attempt holds. Created by the driver per request; the core updates it.
#[derive(Clone, Debug)]
pub struct Ticket {
    pub(crate) meta: RequestMeta,
    pub(crate) origin: Option<ZoneId>,
    pub(crate) holding: Option<Holding>,
    pub(crate) tried_zones: ZoneSet,
    pub(crate) retried: bool,
    pub(crate) fell_back: bool,
    pub(crate) gone: u8,
    /// Why the request left the VMs (kept for fall-through decisions).
    pub(crate) reason: RouteReason,
    /// The route key (call scheduling: the call's "function").
    pub(crate) key: Option<KeyId>,
    /// What the gateway queue noted at the first decision (with a queue configured).
    pub(crate) arrival: Option<Arrival>,
    /// The call waits in the gateway queue under this id.
    pub(crate) queued: Option<QueueId>,
}

impl Ticket {
    /// A request described by `meta`, from edge zone `origin` (or none: the cloud).
    pub fn new(meta: RequestMeta, origin: Option<ZoneId>) -> Self {
        Self {
            meta,
            origin,
            holding: None,
            tried_zones: ZoneSet::default(),
            retried: false,
            fell_back: false,
            gone: 0,
            reason: RouteReason::BudgetExhausted,
            key: None,
            arrival: None,
            queued: None,
        }
    }

    /// The call's route key (call scheduling §4: its function f(i)); without one the
    /// gateway queue files it under [`RouteKeys::OTHER`](super::routes::RouteKeys::OTHER).
    #[must_use]
    pub fn with_key(mut self, key: KeyId) -> Self {
        self.key = Some(key);
        self
    }

    /// The route key.
    pub fn key(&self) -> Option<KeyId> {
        self.key
    }

    /// The arrival the gateway queue noted at the first decision (`None` without a
    /// queue).
    pub fn arrival(&self) -> Option<Arrival> {
        self.arrival
    }

    /// The id under which the call waits in the gateway queue, after
    /// [`Decision::Queue`].
    pub fn queued(&self) -> Option<QueueId> {
        self.queued
    }

    /// The queued call was served: `decision` (from
    /// [`Action::Dequeued`](super::core::Action::Dequeued)) is its attempt, and the
    /// ticket now holds what it holds.
    pub fn on_dequeued(&mut self, decision: Decision) {
        self.queued = None;
        self.holding = match decision {
            Decision::Vm { vm, .. } => Some(Holding::Vm(vm)),
            Decision::Function { lease, .. } => Some(Holding::Function(lease)),
            Decision::Queue { .. } | Decision::Reject { .. } => None,
        };
    }

    /// The request's description.
    pub fn meta(&self) -> &RequestMeta {
        &self.meta
    }

    /// The VM the current attempt runs on, if any.
    pub fn vm(&self) -> Option<VmId> {
        match self.holding {
            Some(Holding::Vm(vm)) => Some(vm),
            _ => None,
        }
    }

    /// Whether the current attempt still holds a VM slot or a function lease.
    pub fn holds(&self) -> bool {
        self.holding.is_some()
    }

    /// The answering attempt's VM slot or function lease is now released by whoever holds
    /// the response (its body guard, a tunnel task) or was released another way (the
    /// instance was lost): the ticket no longer owns it.
    pub fn hand_over(&mut self) {
        self.holding = None;
    }

    /// The function lease of the current attempt, if any.
    pub fn lease(&self) -> Option<Lease> {
        match self.holding {
            Some(Holding::Function(l)) => Some(l),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::InstanceId;
    use crate::placement::Start;

    #[test]
    fn labels_are_the_documented_ones() {
        let kinds = [
            (AttemptKind::First, "first"),
            (AttemptKind::Retry, "retry"),
            (AttemptKind::FallThrough, "fall_through"),
            (AttemptKind::FallBack, "fall_back"),
        ];
        for (k, label) in kinds {
            assert_eq!(k.as_str(), label);
        }
        let reasons = [
            (NotSentReason::ConnectFailed, "connect_failed"),
            (NotSentReason::Throttled, "throttled"),
            (NotSentReason::ColdStartFailed, "cold_start_failed"),
            (NotSentReason::InstanceGone, "instance_gone"),
            (NotSentReason::Unreachable, "unreachable"),
            (NotSentReason::NeverRan, "never_ran"),
            (NotSentReason::ShuttingDown, "shutting_down"),
        ];
        for (r, label) in reasons {
            assert_eq!(r.as_str(), label);
        }
    }

    #[test]
    fn decisions_report_their_reason_and_kind() {
        let lease = Lease {
            zone: ZoneId(1),
            start: Start::Warm(InstanceId(4)),
        };
        let cases = [
            (
                Decision::Vm {
                    vm: VmId(3),
                    kind: AttemptKind::Retry,
                    reason: RouteReason::WithinBudget,
                },
                RouteReason::WithinBudget,
                Some(AttemptKind::Retry),
            ),
            (
                Decision::Function {
                    lease,
                    kind: AttemptKind::FallThrough,
                    reason: RouteReason::NoReadyVm,
                },
                RouteReason::NoReadyVm,
                Some(AttemptKind::FallThrough),
            ),
            (
                Decision::Queue {
                    reason: RouteReason::BudgetExhausted,
                },
                RouteReason::BudgetExhausted,
                None,
            ),
            (
                Decision::Reject {
                    reason: RouteReason::SpillBackRejected,
                },
                RouteReason::SpillBackRejected,
                None,
            ),
        ];
        for (d, reason, kind) in cases {
            assert_eq!((d.reason(), d.kind()), (reason, kind), "{d:?}");
        }
    }

    #[test]
    fn a_ticket_tells_what_its_attempt_holds_until_handed_over() {
        let meta = RequestMeta {
            upgrade: true,
            idempotent: false,
        };
        let mut t = Ticket::new(meta, Some(ZoneId(2)));
        assert_eq!(*t.meta(), meta);
        assert!(!t.holds());
        assert_eq!((t.vm(), t.lease()), (None, None));
        t.holding = Some(Holding::Vm(VmId(7)));
        assert!(t.holds());
        assert_eq!((t.vm(), t.lease()), (Some(VmId(7)), None));
        let lease = Lease {
            zone: ZoneId(0),
            start: Start::Untracked,
        };
        t.holding = Some(Holding::Function(lease));
        assert_eq!((t.vm(), t.lease()), (None, Some(lease)));
        t.hand_over();
        assert!(!t.holds());
        assert_eq!(t.lease(), None);
    }
}
