//! Routing policies: VM or function tier, per request — LIBRA §III-C (Load Balancer).
//!
//! LIBRA's balancer ([`VmFirst`]) is VM-first: a request goes to the ready VM with the
//! fewest outstanding requests while the VM budget allows it; otherwise it spills to the
//! function tier. Two budget rules ([`BudgetRule`]):
//! * [`BudgetRule::Quota`] — LIBRA §III-C as written and as the authors' simulator runs
//!   it: the first ρ·vm_reqs·E requests of each epoch (length E) go to VMs, the rest of
//!   the epoch spills ([`EpochQuota`]);
//! * [`BudgetRule::TokenBucket`] — a bucket filled at ρ·vm_reqs tokens/s whose capacity is
//!   one second's budget: it smooths the budget over the epoch, but after a quiet second
//!   it can admit up to twice the budget within one second ([`TokenBucket`]).
//!
//! Every decision carries a [`RouteReason`] that drivers turn into metric labels and log
//! fields. The VM table ([`VmTable`]) is owned by the
//! [`Controller`](super::controller::Controller) and lent to the policy read-only.

use super::{Time, VmId};

/// What the balancer needs to know about a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// The request asks for a protocol upgrade (`Upgrade` header, e.g. WebSocket). Such
    /// requests are pinned to VMs: function tiers cannot hold a tunnel.
    pub upgrade: bool,
    /// The method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) and may be
    /// retried once after a connect failure (http-cases C17).
    pub idempotent: bool,
}

/// Which attempt of a request is being routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The first routing decision for the request (counted by the traffic monitor).
    First,
    /// A retry after a connect failure to `failed` (no byte was sent). Idempotent only.
    RetryAfterConnectFailure {
        /// The VM that refused the connection; not chosen again.
        failed: VmId,
    },
    /// No function zone could run the request (full, throttled — e.g. Lambda 429 —,
    /// unreachable, cold start failed): fall back to a VM with a free slot.
    SpillBack,
}

/// Why a request went where it went. Label values are fixed (see [`Self::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteReason {
    /// A token was available and a VM is ready.
    WithinBudget,
    /// The VM budget (this epoch's quota, or the token bucket) is used up: spilled to
    /// functions.
    BudgetExhausted,
    /// No VM is ready (none provisioned, or all booting/draining).
    NoReadyVm,
    /// An `Upgrade` request pinned to a VM.
    UpgradePinned,
    /// An `Upgrade` request but no VM is ready: rejected (503).
    UpgradeNoReadyVm,
    /// A fall-back from the function tier found no ready VM with a free slot: rejected
    /// (503).
    SpillBackRejected,
    /// A fall-back from the function tier went to a VM with a free slot although no
    /// token was left (counted apart from `within_budget`).
    FallBackOverBudget,
    /// The policy sends every request to VMs (MAX, AUTO baselines).
    VmOnly,
    /// The policy sends every request to functions (FAAS baseline).
    FunctionOnly,
    /// Spock: VMs are at capacity while new ones boot; functions absorb the excess.
    ScalingOut,
    /// A token was available but every ready VM already has `max_outstanding_per_vm`
    /// requests in flight: spilled (no token taken).
    VmsSaturated,
    /// Nothing was free and the gateway queue was full: rejected (503).
    QueueFull,
    /// The call waited `max_queue_wait_seconds` in the gateway queue: rejected (503).
    QueueTimeout,
    /// A deferred asynchronous call reached `deadline − (E[p] + margin)`: sent to the
    /// function tier rather than missed (ProFaaStinate §3).
    AsyncDeadline,
}

impl RouteReason {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::WithinBudget => "within_budget",
            RouteReason::BudgetExhausted => "budget_exhausted",
            RouteReason::NoReadyVm => "no_ready_vm",
            RouteReason::UpgradePinned => "upgrade_pinned",
            RouteReason::UpgradeNoReadyVm => "upgrade_no_ready_vm",
            RouteReason::SpillBackRejected => "spill_back_rejected",
            RouteReason::FallBackOverBudget => "fall_back_over_budget",
            RouteReason::VmOnly => "vm_only",
            RouteReason::FunctionOnly => "function_only",
            RouteReason::ScalingOut => "scaling_out",
            RouteReason::VmsSaturated => "vms_saturated",
            RouteReason::QueueFull => "queue_full",
            RouteReason::QueueTimeout => "queue_timeout",
            RouteReason::AsyncDeadline => "async_deadline",
        }
    }
}

/// A routing decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Send to this VM.
    Vm {
        /// The chosen VM (ready, fewest outstanding requests).
        vm: VmId,
        /// Why.
        reason: RouteReason,
    },
    /// Send to the function tier.
    Function {
        /// Why.
        reason: RouteReason,
    },
    /// Answer 503 locally (with `Retry-After`).
    Reject {
        /// Why.
        reason: RouteReason,
    },
}

impl Route {
    /// The reason of any variant.
    pub fn reason(&self) -> RouteReason {
        match *self {
            Route::Vm { reason, .. } | Route::Function { reason } | Route::Reject { reason } => {
                reason
            }
        }
    }
}

/// Life-cycle state of one VM, as the controller tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Launched; not ready yet (booting, address resolution, health probe).
    Booting,
    /// Ready: takes requests.
    Ready,
    /// Takes no new requests; stops when its outstanding requests reach zero.
    Draining,
}

/// One row of the [`VmTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmEntry {
    /// The VM.
    pub id: VmId,
    /// Its state.
    pub state: VmState,
    /// Requests sent to it that have not finished.
    pub outstanding: u32,
    /// An attempt on it failed and a probe is deciding whether it is alive: no new
    /// request is routed to it meanwhile (it still counts as ready for capacity).
    pub suspect: bool,
}

/// The VM pool as the policy sees it. Rows are kept in launch order (which is id order:
/// ids are allocated increasing), so a row is found by binary search; the ready rows are
/// also indexed by `(outstanding, id)` in a tournament tree over the rows, so the
/// least-loaded ready VM is found in O(1) (O(log n) when one VM is excluded) and a load
/// change costs O(log n) array steps (a MAX fleet of thousands of VMs routes as fast as
/// one of eight). A row is found from its id in O(1) through `RowIndex`.
#[derive(Clone, Debug, Default)]
pub struct VmTable {
    rows: Vec<VmEntry>,
    ready: ReadyIndex,
    /// Row of each id (ids are dense: allocated increasing, a few removed).
    by_id: RowIndex,
    /// Rows per [`VmState`] (`Booting`, `Ready`, `Draining`).
    counts: [u32; 3],
}

/// The row of each VM id, by offset from the first row's id: every request's VM lookup
/// (route, finish) is one array read instead of a binary search over the rows once a
/// scale-in removed VMs (ids no longer match row offsets). Entries are exact or
/// [`RowIndex::NONE`]; a lookup that misses falls back to the binary search. Rebuilt
/// with the ready index when rows move; left empty when the ids between the first and
/// the last row are far more than the rows (one old VM among many relaunched ones), so
/// its memory stays within a few words per row.
#[derive(Clone, Debug, Default)]
struct RowIndex {
    /// Id of slot 0.
    base: u64,
    /// Row index per id offset, [`RowIndex::NONE`] for ids not in the table.
    rows: Vec<u32>,
}

impl RowIndex {
    const NONE: u32 = u32::MAX;

    /// The most id slots kept for `rows` rows.
    fn limit(rows: usize) -> usize {
        4 * rows + 1024
    }

    fn rebuild(&mut self, rows: &[VmEntry]) {
        self.rows.clear();
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return;
        };
        let span = last.id.0 - first.id.0;
        if span >= Self::limit(rows.len()) as u64 || rows.len() >= Self::NONE as usize {
            return;
        }
        self.base = first.id.0;
        self.rows.resize(span as usize + 1, Self::NONE);
        for (i, r) in rows.iter().enumerate() {
            self.rows[(r.id.0 - self.base) as usize] = i as u32;
        }
    }

    /// Row `index` with id `id`, appended after every other row.
    fn push(&mut self, rows: &[VmEntry], index: usize, id: VmId) {
        if index == 0 {
            self.base = id.0;
            self.rows.clear();
        } else if self.rows.is_empty() {
            // Left empty by the limit: stays so until the next rebuild.
            return;
        }
        let slot = (id.0 - self.base) as usize;
        if slot >= Self::limit(rows.len()) || index >= Self::NONE as usize {
            self.rows.clear();
            return;
        }
        self.rows.resize(slot + 1, Self::NONE);
        self.rows[slot] = index as u32;
    }

    #[inline]
    fn get(&self, id: VmId) -> Option<usize> {
        let slot = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        match self.rows.get(slot) {
            Some(&i) if i != Self::NONE => Some(i as usize),
            _ => None,
        }
    }
}

/// A tournament (min segment) tree over the rows: leaf `i` holds
/// `outstanding << 32 | i` for a ready row `i` and `u64::MAX` otherwise, so the minimum
/// is the ready row with the fewest outstanding requests and, among those, the oldest.
/// Rebuilt in O(n) when rows move (a removal, an insertion out of order, growth past a
/// power of two); a load or state change updates one leaf's path.
#[derive(Clone, Debug, Default)]
struct ReadyIndex {
    /// Leaves (a power of two, ≥ the rows).
    leaves: usize,
    /// `tree[1]` is the root; the leaves are `tree[leaves..]`.
    tree: Vec<u64>,
}

const NOT_READY: u64 = u64::MAX;

fn leaf_key(row: &VmEntry, index: usize) -> u64 {
    if row.state == VmState::Ready && !row.suspect {
        (u64::from(row.outstanding) << 32) | index as u64
    } else {
        NOT_READY
    }
}

impl ReadyIndex {
    fn rebuild(&mut self, rows: &[VmEntry]) {
        self.leaves = rows.len().next_power_of_two().max(1);
        self.tree.clear();
        self.tree.resize(2 * self.leaves, NOT_READY);
        for (i, r) in rows.iter().enumerate() {
            self.tree[self.leaves + i] = leaf_key(r, i);
        }
        for n in (1..self.leaves).rev() {
            self.tree[n] = self.tree[2 * n].min(self.tree[2 * n + 1]);
        }
    }

    #[inline]
    fn set(&mut self, index: usize, key: u64) {
        let mut n = self.leaves + index;
        let mut v = key;
        self.tree[n] = v;
        while n > 1 {
            v = v.min(self.tree[n ^ 1]);
            n /= 2;
            // A node that keeps its value leaves every ancestor as it was.
            if self.tree[n] == v {
                break;
            }
            self.tree[n] = v;
        }
    }

    /// The row index of the minimum, skipping row `exclude`.
    fn min(&self, exclude: Option<usize>) -> Option<usize> {
        let key = match exclude {
            None => self.tree.get(1).copied().unwrap_or(NOT_READY),
            Some(i) => {
                // The minimum over every leaf but `i`: the siblings along its path.
                let mut n = self.leaves + i;
                let mut best = NOT_READY;
                while n > 1 {
                    best = best.min(self.tree[n ^ 1]);
                    n /= 2;
                }
                best
            }
        };
        (key != NOT_READY).then_some((key & u64::from(u32::MAX)) as usize)
    }
}

/// A row of the [`VmTable`] borrowed for change; the ready index follows the change when
/// the borrow ends.
pub(crate) struct RowMut<'a> {
    table: &'a mut VmTable,
    index: usize,
    before: VmEntry,
}

impl std::ops::Deref for RowMut<'_> {
    type Target = VmEntry;
    fn deref(&self) -> &VmEntry {
        &self.table.rows[self.index]
    }
}

impl std::ops::DerefMut for RowMut<'_> {
    fn deref_mut(&mut self) -> &mut VmEntry {
        &mut self.table.rows[self.index]
    }
}

impl Drop for RowMut<'_> {
    fn drop(&mut self) {
        let after = self.table.rows[self.index];
        if after != self.before {
            let t = &mut *self.table;
            t.counts[self.before.state as usize] -= 1;
            t.counts[after.state as usize] += 1;
            let (old, new) = (
                leaf_key(&self.before, self.index),
                leaf_key(&after, self.index),
            );
            if old != new {
                t.ready.set(self.index, new);
            }
        }
    }
}

impl VmTable {
    /// All rows, in launch order.
    pub fn rows(&self) -> &[VmEntry] {
        &self.rows
    }

    #[inline]
    fn position(&self, id: VmId) -> Option<usize> {
        if let Some(i) = self.by_id.get(id) {
            debug_assert_eq!(self.rows[i].id, id);
            return Some(i);
        }
        // Ids increase by one per launch: without removals a row sits at its id's offset
        // from the first row, and never after it.
        let first = self.rows.first()?.id.0;
        let guess = usize::try_from(id.0.checked_sub(first)?).ok()?;
        match self.rows.get(guess) {
            Some(r) if r.id == id => Some(guess),
            _ => self.rows[..guess.min(self.rows.len())]
                .binary_search_by_key(&id, |r| r.id)
                .ok(),
        }
    }

    /// The row of `id`, if the VM is known.
    pub fn get(&self, id: VmId) -> Option<&VmEntry> {
        self.position(id).map(|i| &self.rows[i])
    }

    pub(crate) fn get_mut(&mut self, id: VmId) -> Option<RowMut<'_>> {
        let index = self.position(id)?;
        let before = self.rows[index];
        Some(RowMut {
            table: self,
            index,
            before,
        })
    }

    /// Change the requests in flight on `id`'s row by `delta` (+1 for a request sent,
    /// −1 saturating at zero for one finished), keeping the ready index in step: what
    /// [`Self::get_mut`] and an assignment do, without comparing the whole row (every
    /// VM request changes its count twice). The row's state and its new count; `None`
    /// for an unknown VM.
    #[inline]
    pub(crate) fn add_outstanding(&mut self, id: VmId, delta: i32) -> Option<(VmState, u32)> {
        let index = self.position(id)?;
        let row = &mut self.rows[index];
        let outstanding = if delta >= 0 {
            row.outstanding + delta.unsigned_abs()
        } else {
            row.outstanding.saturating_sub(delta.unsigned_abs())
        };
        if outstanding != row.outstanding {
            row.outstanding = outstanding;
            if row.state == VmState::Ready && !row.suspect {
                let key = leaf_key(row, index);
                self.ready.set(index, key);
            }
        }
        Some((row.state, outstanding))
    }

    /// Add a row. Ids must increase (the controller allocates them so); a smaller id is
    /// inserted in its place.
    pub(crate) fn insert(&mut self, id: VmId, state: VmState) {
        let row = VmEntry {
            id,
            state,
            outstanding: 0,
            suspect: false,
        };
        self.counts[state as usize] += 1;
        match self.rows.last() {
            Some(last) if last.id >= id => {
                let i = self.rows.partition_point(|r| r.id < id);
                self.rows.insert(i, row);
                self.ready.rebuild(&self.rows);
                self.by_id.rebuild(&self.rows);
            }
            _ => {
                self.rows.push(row);
                let i = self.rows.len() - 1;
                self.by_id.push(&self.rows, i, id);
                if i < self.ready.leaves {
                    self.ready.set(i, leaf_key(&row, i));
                } else {
                    self.ready.rebuild(&self.rows);
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, id: VmId) -> Option<VmEntry> {
        let i = self.position(id)?;
        let row = self.rows.remove(i);
        self.counts[row.state as usize] -= 1;
        self.ready.rebuild(&self.rows);
        self.by_id.rebuild(&self.rows);
        Some(row)
    }

    /// Number of VMs in `state`. O(1).
    pub fn count(&self, state: VmState) -> u32 {
        self.counts[state as usize]
    }

    /// The ready VM with the fewest outstanding requests (ties: the oldest), skipping
    /// `exclude` and suspect VMs. O(1), O(log n) with `exclude`.
    pub fn least_outstanding_ready(&self, exclude: Option<VmId>) -> Option<VmId> {
        self.least_loaded_ready(exclude).map(|r| r.id)
    }

    /// Like [`Self::least_outstanding_ready`], returning the whole row.
    pub fn least_loaded_ready(&self, exclude: Option<VmId>) -> Option<&VmEntry> {
        let skip = exclude.and_then(|id| self.position(id));
        self.ready.min(skip).map(|i| &self.rows[i])
    }
}

/// A routing policy: a sans-IO state machine asked once per routing decision.
pub trait RoutingPolicy: Send {
    /// Short name for reports.
    fn name(&self) -> &'static str;

    /// The controller publishes a new VM budget (requests/s, before ρ). LIBRA §III-B,
    /// Alg. 1 line 6: raised only as new VMs become ready, lowered before VMs drain.
    fn set_vm_budget(&mut self, now: Time, vm_reqs_rps: f64);

    /// Decide where one attempt of a request goes.
    fn route(&mut self, now: Time, req: &RequestMeta, attempt: Attempt, vms: &VmTable) -> Route;

    /// An idle-mode release of a deferred asynchronous call asks for one VM admission
    /// (ProFaaStinate §3): `true` takes it. LIBRA's balancer takes a token or a quota admission; policies
    /// without a budget always admit.
    fn take_deferred_token(&mut self, _now: Time) -> bool {
        true
    }

    /// ρ, the share of the VM budget this policy sends to VMs (LIBRA §III-C), for a
    /// policy that has one; `None` for the baselines.
    fn rho(&self) -> Option<f64> {
        None
    }

    /// Use a new ρ from the next [`Self::set_vm_budget`] on, keeping the tokens or the
    /// epoch's admissions (a configuration reload). `false`: this
    /// policy has no ρ and nothing changed.
    fn set_rho(&mut self, _rho: f64) -> bool {
        false
    }
}

/// A token bucket refilled continuously at `rate` tokens/s, holding at most one second's
/// worth (and at least one token, so rates below 1/s still admit requests).
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Time,
}

impl TokenBucket {
    /// An empty bucket with rate 0.
    pub fn new() -> Self {
        Self {
            rate: 0.0,
            capacity: 0.0,
            tokens: 0.0,
            last: Time::ZERO,
        }
    }

    /// Tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Tokens available at `now` (after refill).
    pub fn available(&mut self, now: Time) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// Change the rate at `now`. The capacity becomes one second's budget; tokens above it
    /// are dropped. A raise from zero starts with a full bucket so that newly ready VMs are
    /// used at once.
    pub fn set_rate(&mut self, now: Time, rate: f64) {
        self.refill(now);
        let rate = if rate.is_finite() {
            rate.max(0.0)
        } else {
            f64::MAX
        };
        let was_empty_rate = self.rate == 0.0;
        self.rate = rate;
        self.capacity = if rate > 0.0 { rate.max(1.0) } else { 0.0 };
        if was_empty_rate {
            self.tokens = self.capacity;
        }
        self.tokens = self.tokens.min(self.capacity);
    }

    /// Take one token at `now` if one is available.
    #[inline]
    pub fn try_take(&mut self, now: Time) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    #[inline]
    fn refill(&mut self, now: Time) {
        if now > self.last {
            let dt = (now - self.last).as_secs_f64();
            self.tokens = (self.tokens + self.rate * dt).min(self.capacity);
            self.last = now;
        }
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self::new()
    }
}

/// The VM budget rule of [`VmFirst`] (`libra.balancer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetRule {
    /// A per-epoch quota of ρ·vm_reqs·E requests: the first ones of each epoch go to VMs
    /// (LIBRA §III-C; the authors' simulator). See [`EpochQuota`].
    Quota {
        /// The authors' truncation: the quota is `⌊ρ·⌊vm_reqs·E⌋⌋` (their
        /// `int(ρ·int(avg+φ·std))`) instead of the real value ρ·vm_reqs·E.
        truncate: bool,
    },
    /// A token bucket refilled at ρ·vm_reqs tokens/s, one second's budget deep. See
    /// [`TokenBucket`].
    TokenBucket,
}

/// LIBRA §III-C's budget rule: epoch `i` (`[i·E, (i+1)·E)` on the policy clock) admits
/// its first `q` requests to VMs, `q = ρ·vm_reqs·E` with the `vm_reqs` in force when the
/// request arrives (a budget raised mid-epoch raises the open epoch's quota; requests
/// already admitted stay counted).
///
/// The real-valued quota keeps its fraction: an epoch admits while
/// `admitted + 1 ≤ q + carry`, and `carry` (in `[0, 1)`) is what was left of the
/// previous epoch's fraction, so that at a steady budget N epochs admit `⌊N·q⌋`
/// requests (a budget of 0.5 requests/epoch admits one request every other epoch).
/// With `truncate` the quota is the authors' `⌊ρ·⌊vm_reqs·E⌋⌋` and nothing carries.
#[derive(Clone, Debug)]
pub struct EpochQuota {
    epoch_ns: u128,
    truncate: bool,
    per_epoch: f64,
    /// Index of the epoch `admitted` counts.
    index: u128,
    /// That epoch's span `[start, end)`, ns: a request inside it needs no division.
    span: (u128, u128),
    admitted: u64,
    carry: f64,
}

impl EpochQuota {
    /// A quota of zero for epochs of length `epoch` (non-zero; config validation
    /// guarantees it).
    pub fn new(epoch: std::time::Duration, truncate: bool) -> Self {
        Self {
            epoch_ns: epoch.as_nanos().max(1),
            truncate,
            per_epoch: 0.0,
            index: 0,
            span: (0, epoch.as_nanos().max(1)),
            admitted: 0,
            carry: 0.0,
        }
    }

    /// The quota per epoch, requests (ρ·vm_reqs·E, or `⌊ρ·⌊vm_reqs·E⌋⌋` truncated).
    pub fn per_epoch(&self) -> f64 {
        self.per_epoch
    }

    /// Set the budget at `now`: `vm_reqs_rps` before ρ (truncation applies to vm_reqs·E
    /// before ρ and again after it).
    fn set(&mut self, now: Time, rho: f64, vm_reqs_rps: f64) {
        self.roll(now);
        let vm_reqs = if vm_reqs_rps.is_finite() {
            vm_reqs_rps.max(0.0)
        } else {
            f64::MAX
        };
        let per_epoch_vm_reqs = vm_reqs * self.epoch_ns as f64 / 1e9;
        self.per_epoch = if self.truncate {
            (rho * per_epoch_vm_reqs.floor()).floor()
        } else {
            rho * per_epoch_vm_reqs
        };
    }

    /// The rate the quota amounts to, requests/s.
    fn rate(&self) -> f64 {
        self.per_epoch * 1e9 / self.epoch_ns as f64
    }

    fn quota(&self) -> f64 {
        let q = self.per_epoch();
        if self.truncate {
            q.floor()
        } else {
            q + self.carry
        }
    }

    #[inline]
    fn roll(&mut self, now: Time) {
        let ns = now.as_nanos();
        if self.span.0 <= ns && ns < self.span.1 {
            return;
        }
        let index = ns / self.epoch_ns;
        self.span = (
            index * self.epoch_ns,
            index.saturating_add(1).saturating_mul(self.epoch_ns),
        );
        if index != self.index {
            if !self.truncate {
                // Only fractions carry (the ended epoch's and those of quiet epochs in
                // between): whole requests not used are not banked (that is the token
                // bucket's burst).
                let epochs = (index.saturating_sub(self.index)).max(1) as f64;
                let mut total = self.per_epoch * epochs + self.carry;
                // 5 epochs of 9.6 make 48, not 47.999…: snap float noise to the integer.
                if (total - total.round()).abs() < 1e-9 {
                    total = total.round();
                }
                self.carry = (total - total.floor()).clamp(0.0, 1.0 - f64::EPSILON);
            }
            self.index = index;
            self.admitted = 0;
        }
    }

    /// Admit one request at `now` if this epoch's quota allows it.
    #[inline]
    pub fn try_take(&mut self, now: Time) -> bool {
        self.roll(now);
        if (self.admitted + 1) as f64 <= self.quota() + 1e-9 {
            self.admitted += 1;
            true
        } else {
            false
        }
    }
}

/// LIBRA's VM-first balancer — LIBRA §III-C.
///
/// * `Upgrade` requests are pinned to the least-loaded ready VM (they take a token when
///   one is available but are never spilled) or rejected when no VM is ready.
/// * First attempts and retries need a token (room in the epoch's quota, or a token of
///   the bucket — [`BudgetRule`]): without one they go to the function tier. So VM first
///   attempts never exceed the budget.
/// * A fall-back (no function zone could run the call: full, throttled, unreachable, cold
///   start failed) goes to the least-loaded ready VM with a free slot, token or not: the
///   call is better served late on a VM than refused. It takes a token when one is left
///   ([`RouteReason::WithinBudget`]), else it is counted as
///   [`RouteReason::FallBackOverBudget`]. No VM with a free slot: rejected (503).
/// * Optional extension (not in the paper): with `max_outstanding_per_vm`, a request is
///   also spilled when even the least-loaded ready VM already has that many requests in
///   flight. A token bucket admits up to two seconds' budget in one second after a quiet
///   second; with VMs whose capacity is exactly `r_max` (the simulator's slot model) that
///   burst queues. The cap bounds it without changing the bucket.
#[derive(Clone, Debug)]
pub struct VmFirst {
    rho: f64,
    bucket: TokenBucket,
    max_outstanding_per_vm: Option<u32>,
    quota: Option<EpochQuota>,
}

impl VmFirst {
    /// A balancer sending at most `rho`·vm_reqs requests/s to VMs (0 < ρ ≤ 1), with the
    /// token-bucket rule ([`Self::with_budget_rule`] chooses the quota).
    pub fn new(rho: f64) -> Self {
        Self {
            rho,
            bucket: TokenBucket::new(),
            max_outstanding_per_vm: None,
            quota: None,
        }
    }

    /// Use `rule` for the VM budget; `epoch` is the traffic monitor's epoch (the quota's
    /// period, starting at time zero like the monitor's epochs).
    pub fn with_budget_rule(mut self, rule: BudgetRule, epoch: std::time::Duration) -> Self {
        self.quota = match rule {
            BudgetRule::Quota { truncate } => Some(EpochQuota::new(epoch, truncate)),
            BudgetRule::TokenBucket => None,
        };
        self
    }

    /// The budget rule in use.
    pub fn budget_rule(&self) -> BudgetRule {
        match &self.quota {
            Some(q) => BudgetRule::Quota {
                truncate: q.truncate,
            },
            None => BudgetRule::TokenBucket,
        }
    }

    #[inline]
    fn take(&mut self, now: Time) -> bool {
        match &mut self.quota {
            Some(q) => q.try_take(now),
            None => self.bucket.try_take(now),
        }
    }

    /// Also spill when the least-loaded ready VM has `cap` requests in flight.
    pub fn with_max_outstanding_per_vm(mut self, cap: Option<u32>) -> Self {
        self.max_outstanding_per_vm = cap;
        self
    }

    /// The budget's current rate, requests/s after ρ (ρ·vm_reqs; truncated with the
    /// quota's `truncate`).
    pub fn vm_rate(&self) -> f64 {
        match &self.quota {
            Some(q) => q.rate(),
            None => self.bucket.rate(),
        }
    }
}

impl RoutingPolicy for VmFirst {
    fn name(&self) -> &'static str {
        "libra"
    }

    fn set_vm_budget(&mut self, now: Time, vm_reqs_rps: f64) {
        match &mut self.quota {
            Some(q) => q.set(now, self.rho, vm_reqs_rps),
            None => self.bucket.set_rate(now, self.rho * vm_reqs_rps),
        }
    }

    fn take_deferred_token(&mut self, now: Time) -> bool {
        // The same admission as a request's: the epoch quota under `quota`, else a token.
        self.take(now)
    }

    fn rho(&self) -> Option<f64> {
        Some(self.rho)
    }

    fn set_rho(&mut self, rho: f64) -> bool {
        self.rho = rho;
        true
    }

    fn route(&mut self, now: Time, req: &RequestMeta, attempt: Attempt, vms: &VmTable) -> Route {
        let exclude = match attempt {
            Attempt::RetryAfterConnectFailure { failed } => Some(failed),
            _ => None,
        };
        let least = vms.least_loaded_ready(exclude);
        let candidate = least.map(|r| r.id);
        if req.upgrade {
            return match candidate {
                Some(vm) => {
                    self.take(now);
                    Route::Vm {
                        vm,
                        reason: RouteReason::UpgradePinned,
                    }
                }
                None => Route::Reject {
                    reason: RouteReason::UpgradeNoReadyVm,
                },
            };
        }
        if attempt == Attempt::SpillBack {
            return match least {
                Some(row)
                    if self
                        .max_outstanding_per_vm
                        .is_none_or(|cap| row.outstanding < cap) =>
                {
                    let reason = if self.take(now) {
                        RouteReason::WithinBudget
                    } else {
                        RouteReason::FallBackOverBudget
                    };
                    Route::Vm { vm: row.id, reason }
                }
                _ => Route::Reject {
                    reason: RouteReason::SpillBackRejected,
                },
            };
        }
        let spill = |reason| Route::Function { reason };
        match least {
            None => spill(RouteReason::NoReadyVm),
            Some(row)
                if self
                    .max_outstanding_per_vm
                    .is_some_and(|cap| row.outstanding >= cap) =>
            {
                spill(RouteReason::VmsSaturated)
            }
            Some(&VmEntry { id: vm, .. }) => {
                if self.take(now) {
                    Route::Vm {
                        vm,
                        reason: RouteReason::WithinBudget,
                    }
                } else {
                    spill(RouteReason::BudgetExhausted)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn table(n: u64) -> VmTable {
        let mut t = VmTable::default();
        for i in 0..n {
            t.insert(VmId(i), VmState::Ready);
        }
        t
    }

    /// A reload's new ρ keeps the tokens the bucket holds: the rate
    /// and depth change, nothing is refilled or dropped below the new depth.
    #[test]
    fn a_new_rho_keeps_the_bucket_tokens() {
        let (rho0, rho1, budget) = (0.5, 0.8, 20.0);
        let mut b = VmFirst::new(rho0);
        let vms = table(1);
        b.set_vm_budget(Time::ZERO, budget); // full bucket of rho0·budget tokens
        let first = RequestMeta::default();
        let taken = 4;
        for _ in 0..taken {
            assert!(matches!(
                b.route(Time::ZERO, &first, Attempt::First, &vms),
                Route::Vm { .. }
            ));
        }
        assert_eq!(b.rho(), Some(rho0));
        assert!(b.set_rho(rho1));
        b.set_vm_budget(Time::ZERO, budget);
        assert_eq!(b.rho(), Some(rho1));
        assert_eq!(b.vm_rate(), rho1 * budget);
        let left = (0..100)
            .take_while(|_| {
                matches!(
                    b.route(Time::ZERO, &first, Attempt::First, &vms),
                    Route::Vm { .. }
                )
            })
            .count();
        assert_eq!(left, (rho0 * budget) as usize - taken);
    }

    #[test]
    fn bucket_admits_rho_times_budget_per_second_smoothly() {
        let mut b = VmFirst::new(0.5);
        let vms = table(1);
        b.set_vm_budget(Time::ZERO, 20.0); // 10 tokens/s, capacity 10, starts full
        let first = RequestMeta::default();
        let mut to_vm = 0;
        // 40 requests in the first 100 ms: only the 10 banked tokens (+ 1 refilled) admit.
        for i in 0..40u64 {
            let now = Duration::from_micros(i * 2500);
            if matches!(b.route(now, &first, Attempt::First, &vms), Route::Vm { .. }) {
                to_vm += 1;
            }
        }
        assert_eq!(to_vm, 10);
        // After one empty second the bucket is full again but never holds more than 10.
        let mut later = 0;
        for i in 0..40u64 {
            let now = Duration::from_secs(5) + Duration::from_micros(i);
            if matches!(b.route(now, &first, Attempt::First, &vms), Route::Vm { .. }) {
                later += 1;
            }
        }
        assert_eq!(later, 10);
    }

    /// Requests admitted to VMs per epoch when `per_epoch[i]` requests arrive evenly in
    /// epoch `i` (epoch 1 s, VM budget `vm_reqs` req/s before ρ).
    fn admitted(b: &mut VmFirst, per_epoch: &[u64]) -> Vec<u64> {
        let vms = table(1);
        let plain = RequestMeta::default();
        per_epoch
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (0..n)
                    .filter(|j| {
                        let now = Duration::from_secs(i as u64)
                            + Duration::from_nanos(j * 1_000_000_000 / n);
                        matches!(b.route(now, &plain, Attempt::First, &vms), Route::Vm { .. })
                    })
                    .count() as u64
            })
            .collect()
    }

    fn quota(rho: f64, truncate: bool) -> VmFirst {
        VmFirst::new(rho).with_budget_rule(BudgetRule::Quota { truncate }, Duration::from_secs(1))
    }

    #[test]
    fn the_quota_sends_the_first_rho_vm_reqs_of_each_epoch_and_banks_nothing() {
        // ρ = 0.75, vm_reqs = 12 req/s → 9 per epoch, whatever came before: a quiet epoch
        // does not let the next one take 18 (the token bucket would).
        let mut b = quota(0.75, false);
        b.set_vm_budget(Time::ZERO, 12.0);
        assert_eq!(b.vm_rate(), 9.0);
        assert_eq!(
            admitted(&mut b, &[20, 0, 30, 5, 9]),
            vec![9, 0, 9, 5, 9],
            "min(arrivals, 9) per epoch"
        );
        // The token bucket on the same load: the quiet epoch banks a full second's budget.
        let mut tb = VmFirst::new(0.75);
        tb.set_vm_budget(Time::ZERO, 12.0);
        let bucket = admitted(&mut tb, &[20, 0, 30]);
        assert!(bucket[2] > 9, "{bucket:?}");
    }

    #[test]
    fn the_real_quota_carries_its_fraction_and_truncation_drops_it() {
        // ρ = 0.8, vm_reqs = 12 → 9.6 per epoch. Real: epochs admit 9, 10, 9, 10, 10 (the
        // cumulative floor(n·9.6): 9, 19, 28, 38, 48). Truncated (the authors'
        // int(0.8·int(12))): 9 every epoch.
        let load = [50u64; 5];
        let mut real = quota(0.8, false);
        real.set_vm_budget(Time::ZERO, 12.0);
        let got = admitted(&mut real, &load);
        let mut cum = 0.0;
        let expected: Vec<u64> = (1..=5)
            .map(|n| {
                let prev = cum;
                cum = (f64::from(n) * 0.8 * 12.0_f64).floor();
                (cum - prev) as u64
            })
            .collect();
        assert_eq!(got, expected);
        assert_eq!(got.iter().sum::<u64>(), 48);
        let mut trunc = quota(0.8, true);
        trunc.set_vm_budget(Time::ZERO, 12.9);
        // int(0.8 · int(12.9)) = int(9.6) = 9.
        assert_eq!(admitted(&mut trunc, &load), vec![9; 5]);
        // A budget below one request per epoch still admits, every other epoch.
        let mut slow = quota(0.5, false);
        slow.set_vm_budget(Time::ZERO, 1.0);
        assert_eq!(admitted(&mut slow, &[3, 3, 3, 3]), vec![0, 1, 0, 1]);
    }

    #[test]
    fn a_budget_raised_mid_epoch_raises_the_open_epochs_quota() {
        let mut b = quota(0.5, false);
        let vms = table(1);
        let plain = RequestMeta::default();
        b.set_vm_budget(Time::ZERO, 4.0); // 2 per epoch
        let at = |ms| Duration::from_millis(ms);
        let vm = |b: &mut VmFirst, ms| {
            matches!(
                b.route(at(ms), &plain, Attempt::First, &vms),
                Route::Vm { .. }
            )
        };
        assert!(vm(&mut b, 100) && vm(&mut b, 200) && !vm(&mut b, 300));
        b.set_vm_budget(at(400), 10.0); // 5 per epoch: 3 more in this one
        let more = (0..5).filter(|i| vm(&mut b, 500 + i * 10)).count();
        assert_eq!(more, 3);
        b.set_vm_budget(at(700), 0.0);
        assert!(!vm(&mut b, 800), "a lowered budget applies at once");
        assert_eq!(
            b.budget_rule(),
            BudgetRule::Quota { truncate: false },
            "reported as configured"
        );
    }

    #[test]
    fn every_vm_is_found_by_its_id_after_any_change_also_with_sparse_ids() {
        // One VM kept from the start while thousands are launched and removed after it
        // (a long-lived static upstream among autoscaled ones): the id span grows past
        // the row index's limit, and lookups must still find exactly the rows present.
        let mut t = VmTable::default();
        t.insert(VmId(0), VmState::Ready);
        let mut next = 1u64;
        let mut x = 99u64;
        let check = |t: &VmTable, upto: u64| {
            for id in 0..upto + 3 {
                let scan = t.rows().iter().find(|r| r.id == VmId(id));
                assert_eq!(t.get(VmId(id)), scan, "id {id}");
            }
        };
        for step in 0..3_000u32 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            if (x >> 33).is_multiple_of(3) && t.rows().len() > 1 {
                // Remove a VM other than the first one.
                let i = 1 + ((x >> 20) as usize) % (t.rows().len() - 1);
                let id = t.rows()[i].id;
                assert!(t.remove(id).is_some());
            } else {
                t.insert(VmId(next), VmState::Booting);
                next += 1;
            }
            if step.is_multiple_of(97) {
                check(&t, next);
            }
        }
        // A smaller id inserted out of order, then the table emptied and refilled.
        t.insert(VmId(1), VmState::Ready);
        check(&t, next);
        let ids: Vec<VmId> = t.rows().iter().map(|r| r.id).collect();
        for id in ids {
            t.remove(id);
        }
        check(&t, next);
        t.insert(VmId(next + 5), VmState::Ready);
        check(&t, next + 5);
        assert!(
            next > RowIndex::limit(t.rows().len()) as u64,
            "the span passed the limit"
        );
    }

    #[test]
    fn the_ready_index_agrees_with_a_scan_of_the_rows_after_any_change() {
        // A deterministic walk of inserts, state changes, load changes and removals; after
        // each step the indexed choice equals the linear scan it replaced.
        let scan = |t: &VmTable, exclude: Option<VmId>| {
            t.rows()
                .iter()
                .filter(|r| r.state == VmState::Ready && Some(r.id) != exclude)
                .min_by_key(|r| r.outstanding)
                .map(|r| r.id)
        };
        let mut t = VmTable::default();
        let mut next = 0u64;
        let mut x = 12_345u64;
        for step in 0..5_000u32 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let pick = (x >> 33) % 7;
            let any = t
                .rows()
                .get(((x >> 20) as usize) % t.rows().len().max(1))
                .map(|r| r.id);
            match (pick, any) {
                (0 | 1, _) | (_, None) => {
                    t.insert(
                        VmId(next),
                        if pick == 0 {
                            VmState::Booting
                        } else {
                            VmState::Ready
                        },
                    );
                    next += 1;
                }
                (2, Some(id)) => t.get_mut(id).unwrap().state = VmState::Ready,
                (3, Some(id)) => t.get_mut(id).unwrap().state = VmState::Draining,
                // Both ways of changing a count: the row borrow and the counter.
                (4, Some(id)) if step % 2 == 0 => t.get_mut(id).unwrap().outstanding += 1,
                (4, Some(id)) => {
                    t.add_outstanding(id, 1).unwrap();
                }
                (5, Some(id)) if step % 2 == 0 => {
                    let mut r = t.get_mut(id).unwrap();
                    r.outstanding = r.outstanding.saturating_sub(1);
                }
                (5, Some(id)) => {
                    let before = t.get(id).unwrap().outstanding;
                    let (_, after) = t.add_outstanding(id, -1).unwrap();
                    assert_eq!(after, before.saturating_sub(1));
                }
                (_, Some(id)) => {
                    t.remove(id);
                }
            }
            let exclude = any.filter(|_| step % 3 == 0);
            assert_eq!(
                t.least_outstanding_ready(exclude),
                scan(&t, exclude),
                "step {step}"
            );
            assert_eq!(
                t.count(VmState::Ready),
                t.rows()
                    .iter()
                    .filter(|r| r.state == VmState::Ready)
                    .count() as u32
            );
        }
    }

    /// One change of a VM table for the ready-index model check.
    #[derive(Clone, Debug)]
    enum TableOp {
        /// Launch the next id in a state (0 booting, 1 ready, 2 draining).
        Insert(u8),
        /// Launch `n` ready VMs at once (fleets past one and past 64 words).
        Grow(u16),
        /// Of the row at `pick % rows`: set its state.
        State(usize, u8),
        /// Mark or clear it suspect.
        Suspect(usize, bool),
        /// ±1 through the counter.
        Add(usize, bool),
        /// Any count through the row borrow.
        Set(usize, u32),
        /// Remove it.
        Remove(usize),
    }

    fn table_op() -> impl proptest::strategy::Strategy<Value = TableOp> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0u8..3).prop_map(TableOp::Insert),
            1 => (1u16..3_000).prop_map(TableOp::Grow),
            2 => (any::<usize>(), 0u8..3).prop_map(|(p, s)| TableOp::State(p, s)),
            2 => (any::<usize>(), any::<bool>()).prop_map(|(p, s)| TableOp::Suspect(p, s)),
            12 => (any::<usize>(), any::<bool>()).prop_map(|(p, up)| TableOp::Add(p, up)),
            2 => (any::<usize>(), prop_oneof![0u32..8, 0u32..300, Just(100_000)])
                .prop_map(|(p, n)| TableOp::Set(p, n)),
            1 => any::<usize>().prop_map(TableOp::Remove),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The ready index picks what a scan of the rows picks (fewest requests
        /// in flight among ready, non-suspect rows; ties: the oldest), with and without
        /// an excluded VM, after any sequence of launches, state, suspicion and load
        /// changes and removals.
        #[test]
        fn the_ready_index_picks_what_a_scan_picks(
            ops in proptest::collection::vec(table_op(), 1..200),
        ) {
            let scan = |t: &VmTable, exclude: Option<VmId>| {
                t.rows()
                    .iter()
                    .filter(|r| r.state == VmState::Ready && !r.suspect && Some(r.id) != exclude)
                    .min_by_key(|r| r.outstanding)
                    .map(|r| r.id)
            };
            let state = |s: u8| [VmState::Booting, VmState::Ready, VmState::Draining][s as usize];
            let mut t = VmTable::default();
            let mut next = 0u64;
            for op in ops {
                let n = t.rows().len();
                let at = |p: usize| (n > 0).then(|| t.rows()[p % n].id);
                match op {
                    TableOp::Insert(s) => {
                        t.insert(VmId(next), state(s));
                        next += 1;
                    }
                    // At most 5,000 rows: past one summary word (4,096), still quick.
                    TableOp::Grow(k) => {
                        for _ in 0..usize::from(k).min(5_000usize.saturating_sub(n)) {
                            t.insert(VmId(next), VmState::Ready);
                            next += 1;
                        }
                    }
                    TableOp::State(p, s) => if let Some(id) = at(p) {
                        t.get_mut(id).unwrap().state = state(s);
                    },
                    TableOp::Suspect(p, s) => if let Some(id) = at(p) {
                        t.get_mut(id).unwrap().suspect = s;
                    },
                    TableOp::Add(p, up) => if let Some(id) = at(p) {
                        t.add_outstanding(id, if up { 1 } else { -1 }).unwrap();
                    },
                    TableOp::Set(p, c) => if let Some(id) = at(p) {
                        t.get_mut(id).unwrap().outstanding = c;
                    },
                    TableOp::Remove(p) => if let Some(id) = at(p) {
                        t.remove(id);
                    },
                }
                let n = t.rows().len();
                proptest::prop_assert_eq!(t.least_outstanding_ready(None), scan(&t, None));
                let probes = [0, n / 2, n.saturating_sub(1)];
                for p in probes.into_iter().filter(|_| n > 0) {
                    let id = t.rows()[p].id;
                    proptest::prop_assert_eq!(
                        t.least_outstanding_ready(Some(id)),
                        scan(&t, Some(id))
                    );
                }
                // The least-loaded row itself excluded: the runner-up.
                if let Some(best) = scan(&t, None) {
                    proptest::prop_assert_eq!(
                        t.least_outstanding_ready(Some(best)),
                        scan(&t, Some(best))
                    );
                }
            }
        }
    }

    #[test]
    fn picks_the_ready_vm_with_fewest_outstanding() {
        let mut vms = table(3);
        vms.get_mut(VmId(0)).unwrap().outstanding = 4;
        vms.get_mut(VmId(1)).unwrap().outstanding = 1;
        vms.get_mut(VmId(2)).unwrap().state = VmState::Draining;
        let mut b = VmFirst::new(1.0);
        b.set_vm_budget(Time::ZERO, 100.0);
        let r = b.route(Time::ZERO, &RequestMeta::default(), Attempt::First, &vms);
        assert_eq!(
            r,
            Route::Vm {
                vm: VmId(1),
                reason: RouteReason::WithinBudget
            }
        );
        let retry = Attempt::RetryAfterConnectFailure { failed: VmId(1) };
        let r = b.route(Time::ZERO, &RequestMeta::default(), retry, &vms);
        assert_eq!(
            r,
            Route::Vm {
                vm: VmId(0),
                reason: RouteReason::WithinBudget
            }
        );
    }

    #[test]
    fn a_saturated_pool_spills_without_spending_a_token() {
        let mut vms = table(2);
        vms.get_mut(VmId(0)).unwrap().outstanding = 2;
        vms.get_mut(VmId(1)).unwrap().outstanding = 2;
        let mut b = VmFirst::new(1.0).with_max_outstanding_per_vm(Some(2));
        b.set_vm_budget(Time::ZERO, 3.0);
        let r = b.route(Time::ZERO, &RequestMeta::default(), Attempt::First, &vms);
        assert_eq!(
            r,
            Route::Function {
                reason: RouteReason::VmsSaturated
            }
        );
        vms.get_mut(VmId(1)).unwrap().outstanding = 1;
        for _ in 0..3 {
            // The three banked tokens are still there.
            let r = b.route(Time::ZERO, &RequestMeta::default(), Attempt::First, &vms);
            assert_eq!(
                r,
                Route::Vm {
                    vm: VmId(1),
                    reason: RouteReason::WithinBudget
                }
            );
        }
    }

    #[test]
    fn fall_backs_take_a_free_slot_token_or_not() {
        let mut vms = table(2);
        vms.get_mut(VmId(0)).unwrap().outstanding = 2;
        vms.get_mut(VmId(1)).unwrap().outstanding = 1;
        let mut b = VmFirst::new(1.0).with_max_outstanding_per_vm(Some(2));
        b.set_vm_budget(Time::ZERO, 1.0); // one token
        let plain = RequestMeta::default();
        let first = b.route(Time::ZERO, &plain, Attempt::SpillBack, &vms);
        assert_eq!(
            first,
            Route::Vm {
                vm: VmId(1),
                reason: RouteReason::WithinBudget
            }
        );
        let second = b.route(Time::ZERO, &plain, Attempt::SpillBack, &vms);
        assert_eq!(
            second,
            Route::Vm {
                vm: VmId(1),
                reason: RouteReason::FallBackOverBudget
            },
            "no token left, VM 1 still has a free slot"
        );
        vms.get_mut(VmId(1)).unwrap().outstanding = 2;
        assert_eq!(
            b.route(Time::ZERO, &plain, Attempt::SpillBack, &vms),
            Route::Reject {
                reason: RouteReason::SpillBackRejected
            },
            "every VM at its cap"
        );
        assert_eq!(
            b.route(Time::ZERO, &plain, Attempt::SpillBack, &VmTable::default()),
            Route::Reject {
                reason: RouteReason::SpillBackRejected
            }
        );
    }

    #[test]
    fn upgrades_are_pinned_and_first_attempts_need_a_token() {
        let mut b = VmFirst::new(1.0);
        let up = RequestMeta {
            upgrade: true,
            idempotent: true,
        };
        let r = b.route(Time::ZERO, &up, Attempt::First, &VmTable::default());
        assert_eq!(
            r,
            Route::Reject {
                reason: RouteReason::UpgradeNoReadyVm
            }
        );
        let vms = table(1);
        // No budget at all: upgrade still pinned, spill-back rejected, first → function.
        assert!(matches!(
            b.route(Time::ZERO, &up, Attempt::First, &vms),
            Route::Vm { .. }
        ));
        let plain = RequestMeta::default();
        assert_eq!(
            b.route(Time::ZERO, &plain, Attempt::First, &vms),
            Route::Function {
                reason: RouteReason::BudgetExhausted
            }
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A new budget (requests/s before ρ); 0 empties the bucket.
        Budget(f64),
        /// One attempt after `gap_us`: 0 = first, 1 = fall-back, 2 = upgrade.
        Route { gap_us: u32, kind: u8 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            1 => prop_oneof![Just(0.0), 0.2f64..40.0].prop_map(Op::Budget),
            12 => (0u32..150_000, 0u8..3).prop_map(|(gap_us, kind)| Op::Route { gap_us, kind }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// The bucket's tight bound: between any two token-taking VM routes at
        /// `a` ≤ `b` (both counted), at most the capacity in force at `a` (one second of
        /// ρ·budget, at least 1) plus the refill ∫ρ·budget dt over `[a, b]` plus one full
        /// bucket per raise from a zero rate. A bucket holding two seconds, refilling at
        /// budget instead of ρ·budget, or keeping tokens past a lower capacity fails it.
        #[test]
        fn token_routes_never_exceed_capacity_plus_refill(
            ops in proptest::collection::vec(op(), 1..300),
            rho in 0.1f64..1.0,
        ) {
            let vms = table(2);
            let mut b = VmFirst::new(rho);
            let mut now = Time::ZERO;
            // (time, rate, capacity) from each change on; a raise from zero is a bonus.
            let mut rates: Vec<(f64, f64, f64, bool)> = vec![(0.0, 0.0, 0.0, false)];
            let mut takes: Vec<f64> = Vec::new();
            for o in ops {
                match o {
                    Op::Budget(budget) => {
                        b.set_vm_budget(now, budget);
                        let rate = rho * budget;
                        let prev = rates.last().unwrap().1;
                        let cap = if rate > 0.0 { rate.max(1.0) } else { 0.0 };
                        rates.push((now.as_secs_f64(), rate, cap, prev == 0.0 && rate > 0.0));
                        proptest::prop_assert_eq!(b.vm_rate(), rate);
                    }
                    Op::Route { gap_us, kind } => {
                        now += Duration::from_micros(u64::from(gap_us));
                        let (req, attempt) = match kind {
                            0 => (RequestMeta::default(), Attempt::First),
                            1 => (RequestMeta::default(), Attempt::SpillBack),
                            _ => (RequestMeta { upgrade: true, idempotent: false }, Attempt::First),
                        };
                        let r = b.route(now, &req, attempt, &vms);
                        if r.reason() == RouteReason::WithinBudget {
                            takes.push(now.as_secs_f64());
                        }
                        match (kind, r) {
                            (0, Route::Vm { reason, .. }) => proptest::prop_assert_eq!(reason, RouteReason::WithinBudget),
                            (0, Route::Function { reason }) => proptest::prop_assert_eq!(reason, RouteReason::BudgetExhausted),
                            (1, Route::Vm { .. }) => {}
                            (2, Route::Vm { reason, .. }) => proptest::prop_assert_eq!(reason, RouteReason::UpgradePinned),
                            other => proptest::prop_assert!(false, "{:?}", other),
                        }
                    }
                }
            }
            // Refill over [a, b] and the bonuses of raises from zero in (a, b].
            let bound = |a: f64, bt: f64| {
                let mut total = 0.0;
                for (i, &(t, rate, cap, bonus)) in rates.iter().enumerate() {
                    let end = rates.get(i + 1).map_or(f64::INFINITY, |r| r.0);
                    let (lo, hi) = (t.max(a), end.min(bt));
                    if hi > lo {
                        total += rate * (hi - lo);
                    }
                    // A raise at the very instant of `a` may follow the take at `a`.
                    if bonus && t >= a && t <= bt {
                        total += cap;
                    }
                }
                // The capacity in force at `a`: set before it, or at the same instant.
                let before = rates.iter().rev().find(|r| r.0 < a).map_or(0.0, |r| r.2);
                let cap_at_a = rates.iter().filter(|r| r.0 == a).fold(before, |m, r| m.max(r.2));
                cap_at_a + total
            };
            for i in 0..takes.len() {
                for j in i..takes.len() {
                    let n = (j - i + 1) as f64;
                    let limit = bound(takes[i], takes[j]);
                    proptest::prop_assert!(n <= limit + 1e-6, "{} token routes in [{}, {}] s, bound {}", n, takes[i], takes[j], limit);
                }
            }
        }
    }

    /// `EpochQuota::roll`: with an epoch of 250 ms (not 1 s, so an epoch's
    /// start `i·E` is not `i + E`), each epoch `[i·E, (i+1)·E)` admits its own quota:
    /// the last nanosecond before a boundary still counts against the closing epoch, the
    /// boundary itself opens the next one. ρ = 0.6, vm_reqs = 20 req/s → 0.6·20·0.25 = 3
    /// per epoch.
    #[test]
    fn a_quarter_second_quota_opens_each_epoch_exactly_at_its_start() {
        let epoch = Duration::from_millis(250);
        let mut b =
            VmFirst::new(0.6).with_budget_rule(BudgetRule::Quota { truncate: false }, epoch);
        b.set_vm_budget(Time::ZERO, 20.0);
        let per_epoch = (0.6_f64 * 20.0 * 0.25).round() as usize;
        assert_eq!(per_epoch, 3);
        let vms = table(1);
        let plain = RequestMeta::default();
        let mut vm =
            |now: Time| matches!(b.route(now, &plain, Attempt::First, &vms), Route::Vm { .. });
        let ns = Duration::from_nanos;
        for i in [0u32, 1, 2, 3, 7] {
            let start = epoch * i;
            let end = epoch * (i + 1);
            // The first admission at the epoch's very start (the boundary opens it, also
            // after the quiet epochs 4–6), the last one in its last nanosecond.
            assert!(vm(start), "epoch {i} opens at {start:?}");
            assert!(vm(start + epoch / 2), "epoch {i}");
            assert!(vm(end - ns(1)), "epoch {i}: its last nanosecond");
            assert!(!vm(end - ns(1)), "epoch {i}: quota of {per_epoch} used up");
        }
    }

    /// Under the quota rule a deferred asynchronous call released in idle mode takes room
    /// in the epoch's quota, like a request (ProFaaStinate §3 on LIBRA's budget). It took
    /// from the token bucket, which the quota rule never fills, so no deferred call ever
    /// got a VM (found by a mutation run).
    #[test]
    fn deferred_calls_take_room_in_the_epoch_quota() {
        // ρ = 0.6, vm_reqs = 10 req/s, 1 s epochs: 6 VM admissions per epoch, shared by
        // requests and deferred calls.
        let mut b = quota(0.6, false);
        b.set_vm_budget(Time::ZERO, 10.0);
        let per_epoch = (0.6_f64 * 10.0).round() as usize;
        let vms = table(1);
        let plain = RequestMeta::default();
        let t = Duration::from_millis(100);
        // Two requests first: the deferred calls get what is left of the quota.
        for _ in 0..2 {
            assert!(matches!(
                b.route(t, &plain, Attempt::First, &vms),
                Route::Vm { .. }
            ));
        }
        let deferred = (0..10).filter(|_| b.take_deferred_token(t)).count();
        assert_eq!(deferred, per_epoch - 2);
        // And a request after them finds the epoch's quota used up.
        assert!(!matches!(
            b.route(t, &plain, Attempt::First, &vms),
            Route::Vm { .. }
        ));
        // The next epoch opens a fresh quota for deferred calls too.
        let next = Duration::from_millis(1_100);
        assert_eq!(
            (0..10).filter(|_| b.take_deferred_token(next)).count(),
            per_epoch
        );
    }

    /// Rows with the given ids, in order (state and load do not matter to [`RowIndex`]).
    fn entries(ids: &[u64]) -> Vec<VmEntry> {
        ids.iter()
            .map(|&id| VmEntry {
                id: VmId(id),
                state: VmState::Ready,
                outstanding: 0,
                suspect: false,
            })
            .collect()
    }

    /// A [`RowIndex`] built as `VmTable::insert` builds it: one `push` per appended row.
    fn pushed(ids: &[u64]) -> (RowIndex, Vec<VmEntry>) {
        let rows = entries(ids);
        let mut index = RowIndex::default();
        for i in 0..rows.len() {
            index.push(&rows[..=i], i, rows[i].id);
        }
        (index, rows)
    }

    /// Every id from `lo` to `hi` maps to its row in `rows`, or to none when absent.
    fn assert_exact(index: &RowIndex, rows: &[VmEntry], lo: u64, hi: u64) {
        for id in lo..=hi {
            let want = rows.iter().position(|r| r.id == VmId(id));
            assert_eq!(index.get(VmId(id)), want, "id {id}");
        }
    }

    /// Against missed mutants of `RowIndex::limit`: the index keeps at most
    /// 4 slots per row plus 1024, so its memory stays within a few words per row.
    #[test]
    fn the_row_index_keeps_four_slots_per_row_plus_1024() {
        for rows in [0usize, 3, 250] {
            assert_eq!(RowIndex::limit(rows), 4 * rows + 1024, "{rows} rows");
        }
    }

    /// Against missed mutants of `RowIndex::rebuild` and `get`: a rebuilt index finds
    /// every row of ids that do not start at 0 (contiguous, then with gaps) in O(1), and
    /// no row for the ids between, before or after them.
    #[test]
    fn a_rebuilt_row_index_finds_each_row_from_its_id() {
        let base = 600;
        let ids: Vec<u64> = (base..base + 6).collect();
        let rows = entries(&ids);
        let mut index = RowIndex::default();
        index.rebuild(&rows);
        assert_exact(&index, &rows, 0, base + 10);
        assert_eq!(index.get(VmId(base + 3)), Some(3));

        let rows = entries(&[base + 10, base + 12, base + 17]);
        index.rebuild(&rows);
        assert_exact(&index, &rows, base, base + 30);
        assert_eq!(index.get(VmId(base + 17)), Some(2));

        // No rows: nothing found, not even the ids found before.
        index.rebuild(&[]);
        assert_eq!(index.get(VmId(base + 12)), None);
    }

    /// Ids spanning exactly `limit(rows)` slots leave the rebuilt index empty
    /// (every lookup goes to the binary search); one slot less is still indexed.
    #[test]
    fn a_rebuilt_row_index_stays_empty_from_the_limit_on() {
        let base = 7;
        let within = entries(&[base, base + RowIndex::limit(2) as u64 - 1]);
        let mut index = RowIndex::default();
        index.rebuild(&within);
        assert_eq!(index.get(within[0].id), Some(0));
        assert_eq!(index.get(within[1].id), Some(1));

        let at = entries(&[base, base + RowIndex::limit(2) as u64]);
        index.rebuild(&at);
        assert_eq!(index.get(at[0].id), None);
        assert_eq!(index.get(at[1].id), None);
    }

    /// Against missed mutants of `RowIndex::push`: rows appended one by one are found
    /// from their ids (contiguous and with gaps, from a base other than 0).
    #[test]
    fn pushed_rows_are_found_from_their_ids() {
        let ids = [40, 41, 42, 45, 50];
        let (index, rows) = pushed(&ids);
        assert_exact(&index, &rows, 0, 60);
        assert_eq!(index.get(VmId(45)), Some(3));
    }

    /// A push whose slot reaches `limit(rows)` empties the index; it stays
    /// empty for later pushes until a push at row 0 (a fresh base) or a rebuild.
    #[test]
    fn a_push_at_the_limit_empties_the_row_index_until_row_zero_or_a_rebuild() {
        let base = 30;
        // One slot below the limit: kept.
        let edge = base + RowIndex::limit(2) as u64 - 1;
        let (index, rows) = pushed(&[base, edge]);
        assert_eq!(index.get(VmId(base)), Some(0));
        assert_eq!(index.get(VmId(edge)), Some(1));

        // At the limit: emptied.
        let far = base + RowIndex::limit(2) as u64;
        let (mut index, _) = pushed(&[base, far]);
        assert_eq!(index.get(VmId(base)), None);
        assert_eq!(index.get(VmId(far)), None);

        // A later push (its slot well within the limit of three rows) leaves it empty.
        let rows3 = entries(&[base, far, far + 1]);
        index.push(&rows3, 2, VmId(far + 1));
        assert_eq!(index.get(VmId(far + 1)), None);
        assert_eq!(index.get(VmId(base)), None);

        // Row 0 pushed again (the table was emptied): its id is the new base.
        let fresh = base + 5_000;
        let rows1 = entries(&[fresh]);
        index.push(&rows1, 0, VmId(fresh));
        assert_eq!(index.get(VmId(fresh)), Some(0));
        assert_eq!(index.get(VmId(base)), None);
        let rows2 = entries(&[fresh, fresh + 2]);
        index.push(&rows2, 1, VmId(fresh + 2));
        assert_exact(&index, &rows2, fresh - 3, fresh + 5);

        // A rebuild of rows within the limit indexes them again.
        let (mut index, _) = pushed(&[base, far]);
        index.rebuild(&rows);
        assert_exact(&index, &rows, base - 2, edge + 2);
    }
}
