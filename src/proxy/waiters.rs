//! The waiters of the gateway queue (call scheduling §4): a call the core queued when
//! every tier was full waits here until the core dequeues it (capacity freed: its
//! attempt) or its `max_queue_wait_seconds` pass.
//!
//! `Waiters` lives under the driver's one lock beside the policy core, and a waiter is
//! registered in the same lock as the decision that queued its call, so that no
//! dequeue can miss it. The call holds the other end, a `QueueWait`.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::vm_book::VmTarget;
use crate::policy::attempt::Decision;
use crate::policy::sched::QueueId;

/// How a wait in the gateway queue ended.
#[derive(Debug)]
pub enum QueueOutcome {
    /// Capacity freed: the call's attempt (holding its slot or lease) and, for a VM, its
    /// address.
    Served(Decision, Option<VmTarget>),
    /// The call waited `max_queue_wait_seconds`: 503 with `Retry-After`.
    TimedOut,
}

/// The queued calls' waiters, by queue id.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    waiting: HashMap<QueueId, oneshot::Sender<QueueOutcome>>,
}

impl Waiters {
    /// The call queued as `id` waits: its end of the wait.
    pub(super) fn register(&mut self, id: QueueId) -> QueueWait {
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(id, tx);
        QueueWait { rx }
    }

    /// The core dequeued `id` with `decision` (and, for a VM, its address `target`):
    /// `false` when its call went away meanwhile (the caller gives the slot back).
    pub(super) fn serve(
        &mut self,
        id: QueueId,
        decision: Decision,
        target: Option<VmTarget>,
    ) -> bool {
        self.waiting
            .remove(&id)
            .is_some_and(|tx| tx.send(QueueOutcome::Served(decision, target)).is_ok())
    }

    /// `id` waited its longest.
    pub(super) fn time_out(&mut self, id: QueueId) {
        if let Some(tx) = self.waiting.remove(&id) {
            let _ = tx.send(QueueOutcome::TimedOut);
        }
    }

    /// The call queued as `id` left the queue (it went away).
    pub(super) fn leave(&mut self, id: QueueId) {
        self.waiting.remove(&id);
    }
}

/// A queued call's end of its wait ([`Waiters::register`]).
#[derive(Debug)]
pub(super) struct QueueWait {
    rx: oneshot::Receiver<QueueOutcome>,
}

impl QueueWait {
    /// Wait until the call is dequeued or times out (`TimedOut` too when the gateway
    /// dropped the waiter). Cancel-safe: a wait given up may be [`Self::close`]d.
    pub(super) async fn outcome(&mut self) -> QueueOutcome {
        (&mut self.rx).await.unwrap_or(QueueOutcome::TimedOut)
    }

    /// Stop waiting: the decision of a dequeue that came meanwhile, whose slot or lease
    /// the caller gives back (a dequeue after this fails, and its sender gives it back).
    pub(super) fn close(mut self) -> Option<Decision> {
        self.rx.close();
        match self.rx.try_recv() {
            Ok(QueueOutcome::Served(d, _)) => Some(d),
            _ => None,
        }
    }
}
