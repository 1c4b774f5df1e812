//! The VM address book: where each of the policy core's VMs lives (provider instance,
//! base URL, launched by this replica or another), the members of a `static` pool that
//! died and wait to be healthy again, and the health marks — VMs under a suspect probe,
//! consecutive failed health probes.
//!
//! The core (LIBRA §III: the controller's VM table) knows a VM by its id and its state;
//! the book knows its address. `VmBook` lives under the driver's one lock beside the
//! core, so that a VM is adopted, readied or dropped in both at once; its methods that
//! change the VM table take the core.

use std::collections::{HashMap, HashSet};

use http::Uri;

use crate::coord::RegistryVm;
use crate::policy::balancer::VmState;
use crate::policy::core::Core;
use crate::policy::{Time, VmId};

/// Consecutive failed health probes after which a ready VM counts as dead.
pub const UNHEALTHY_AFTER: u32 = 2;

/// A VM chosen for a request: its id and base URL.
#[derive(Clone, Debug)]
pub struct VmTarget {
    /// Controller id.
    pub vm: VmId,
    /// Base URL.
    pub base: Uri,
}

/// Where a VM lives, once known.
#[derive(Clone, Debug, Default)]
pub(super) struct VmRecord {
    /// Its provider-side name, once launched.
    pub(super) instance: Option<String>,
    /// Its base URL, once resolved.
    pub(super) base: Option<Uri>,
    /// Another replica launched it (a registry VM, `crate::coord`): this replica
    /// terminates it only as the pool writer (the leader); otherwise it only stops
    /// routing to it.
    pub(super) foreign: bool,
}

/// A dead member of a `static` pool: probed by the health loop, shown in `/status` as
/// `dead`, and adopted again once healthy.
#[derive(Clone, Debug)]
pub(super) struct Parked {
    /// Its name (the configured URL).
    pub(super) instance: String,
    /// Its base URL.
    pub(super) base: Uri,
    /// The controller id it had while it served (`vm-2`), for `/status`.
    pub(super) id: String,
    /// When it died, seconds since the Unix epoch.
    pub(super) since_unix_seconds: u64,
    /// Why it died.
    pub(super) last_error: &'static str,
}

/// The address book of the core's VMs, the parked `static` members and the VMs whose
/// suspect probe is running.
#[derive(Debug, Default)]
pub(super) struct VmBook {
    records: HashMap<VmId, VmRecord>,
    parked: Vec<Parked>,
    /// VMs marked suspect whose probe is running (one probe per VM at a time).
    suspects: HashSet<VmId>,
}

impl VmBook {
    /// Adopt `instance` at `base` as a ready VM of `core` and of the book (`foreign`:
    /// another replica's, from the leader's registry). Returns its id.
    pub(super) fn adopt_ready(
        &mut self,
        core: &mut Core,
        now: Time,
        instance: String,
        base: Uri,
        foreign: bool,
    ) -> VmId {
        let vm = core.adopt_ready_vm(now);
        self.records.insert(
            vm,
            VmRecord {
                instance: Some(instance),
                base: Some(base),
                foreign,
            },
        );
        vm
    }

    /// Adopt `instance`, launched but not ready yet (an earlier leader's launch), as a
    /// booting VM of `core` and of the book; its boot resolves the address. Returns its
    /// id.
    pub(super) fn adopt_booting(&mut self, core: &mut Core, now: Time, instance: String) -> VmId {
        let vm = core.adopt_booting_vm(now);
        self.records.insert(
            vm,
            VmRecord {
                instance: Some(instance),
                base: None,
                foreign: false,
            },
        );
        vm
    }

    /// The core launches `vm`: an entry without an instance or an address yet.
    pub(super) fn launching(&mut self, vm: VmId) {
        self.records.insert(vm, VmRecord::default());
    }

    /// The launch of `vm` (still in `core`'s table) produced `instance`: `false` when the
    /// VM was given up meanwhile (its entry is gone then; the caller terminates the
    /// instance).
    pub(super) fn launched(&mut self, core: &Core, vm: VmId, instance: &str) -> bool {
        match self.records.get_mut(&vm) {
            Some(r) if core.controller().vms().get(vm).is_some() => {
                r.instance = Some(instance.to_string());
                true
            }
            _ => {
                self.records.remove(&vm);
                false
            }
        }
    }

    /// `vm` answers at `base` (its boot's readiness probe passed).
    pub(super) fn resolved(&mut self, vm: VmId, base: Uri) {
        if let Some(r) = self.records.get_mut(&vm) {
            r.base = Some(base);
        }
    }

    /// `vm`'s entry.
    pub(super) fn record(&self, vm: VmId) -> Option<&VmRecord> {
        self.records.get(&vm)
    }

    /// Forget `vm`; its entry, when it had one (whoever removes it terminates the
    /// instance).
    pub(super) fn remove(&mut self, vm: VmId) -> Option<VmRecord> {
        self.records.remove(&vm)
    }

    /// `vm` with its base URL, once resolved.
    pub(super) fn target(&self, vm: VmId) -> Option<VmTarget> {
        self.records
            .get(&vm)
            .and_then(|r| r.base.clone())
            .map(|base| VmTarget { vm, base })
    }

    /// Every VM `core` counts ready, with its base URL.
    pub(super) fn ready_targets(&self, core: &Core) -> Vec<VmTarget> {
        core.controller()
            .vms()
            .rows()
            .iter()
            .filter(|r| r.state == VmState::Ready)
            .filter_map(|r| self.target(r.id))
            .collect()
    }

    /// The VMs `core` counts ready whose entry matches `pred`.
    pub(super) fn ready_where(&self, core: &Core, pred: impl Fn(&VmRecord) -> bool) -> Vec<VmId> {
        let vms = core.controller().vms();
        self.records
            .iter()
            .filter(|(vm, r)| {
                pred(r) && vms.get(**vm).is_some_and(|row| row.state == VmState::Ready)
            })
            .map(|(vm, _)| *vm)
            .collect()
    }

    /// The instance names of every entry.
    pub(super) fn instances(&self) -> HashSet<String> {
        self.records
            .values()
            .filter_map(|r| r.instance.clone())
            .collect()
    }

    /// The VM of `instance`, when the book has it.
    pub(super) fn vm_of(&self, instance: &str) -> Option<VmId> {
        self.records
            .iter()
            .find(|(_, r)| r.instance.as_deref() == Some(instance))
            .map(|(vm, _)| *vm)
    }

    /// The ready VMs of `core` with an instance and an address: what a leader publishes
    /// to the other replicas (`crate::coord`).
    pub(super) fn registry(&self, core: &Core) -> Vec<RegistryVm> {
        core.controller()
            .vms()
            .rows()
            .iter()
            .filter(|r| r.state == VmState::Ready)
            .filter_map(|r| {
                let rec = self.records.get(&r.id)?;
                Some(RegistryVm {
                    instance: rec.instance.clone()?,
                    base: rec.base.as_ref()?.to_string(),
                })
            })
            .collect()
    }

    /// Mark `vm` suspect: `false` when its probe already runs.
    pub(super) fn mark_suspect(&mut self, vm: VmId) -> bool {
        self.suspects.insert(vm)
    }

    /// `vm`'s suspect probe ended.
    pub(super) fn probe_ended(&mut self, vm: VmId) {
        self.suspects.remove(&vm);
    }

    /// Park the dead `static` member `vm` (its entry `record`, already removed) until it
    /// is healthy again; nothing without an instance and an address.
    pub(super) fn park(&mut self, vm: VmId, record: &VmRecord, why: &'static str) {
        if let VmRecord {
            instance: Some(instance),
            base: Some(base),
            ..
        } = record
        {
            self.parked.push(Parked {
                instance: instance.clone(),
                base: base.clone(),
                id: vm.to_string(),
                since_unix_seconds: unix_seconds(),
                last_error: why,
            });
        }
    }

    /// The parked `static` members.
    pub(super) fn parked(&self) -> &[Parked] {
        &self.parked
    }

    /// The parked member at `base` is healthy again: adopted as a ready VM of `core`.
    pub(super) fn unpark(&mut self, core: &mut Core, now: Time, base: &Uri) -> Option<VmId> {
        let i = self.parked.iter().position(|p| &p.base == base)?;
        let Parked { instance, base, .. } = self.parked.remove(i);
        Some(self.adopt_ready(core, now, instance, base, false))
    }

    /// Make the `static` pool exactly `members` (name = URL, base): members no longer
    /// listed leave `core`'s pool (their in-flight requests finish), new ones are adopted
    /// as ready VMs. Returns (added, removed).
    pub(super) fn set_static_members(
        &mut self,
        core: &mut Core,
        now: Time,
        members: &[(String, Uri)],
    ) -> (usize, usize) {
        let keep: HashSet<&str> = members.iter().map(|(name, _)| name.as_str()).collect();
        let gone: Vec<VmId> = self
            .records
            .iter()
            .filter(|(_, r)| r.instance.as_deref().is_some_and(|i| !keep.contains(i)))
            .map(|(vm, _)| *vm)
            .collect();
        let parked_before = self.parked.len();
        self.parked.retain(|p| keep.contains(p.instance.as_str()));
        for vm in &gone {
            core.on_vm_failed(now, *vm);
            self.records.remove(vm);
        }
        let present: HashSet<String> = self
            .records
            .values()
            .filter_map(|r| r.instance.clone())
            .chain(self.parked.iter().map(|p| p.instance.clone()))
            .collect();
        let mut added = 0;
        for (name, base) in members {
            if !present.contains(name) {
                self.adopt_ready(core, now, name.clone(), base.clone(), false);
                added += 1;
            }
        }
        (added, gone.len() + parked_before - self.parked.len())
    }
}

/// Consecutive failed health probes per ready VM (the health loop's marks).
#[derive(Debug, Default)]
pub(super) struct HealthMarks {
    failures: HashMap<VmId, u32>,
}

impl HealthMarks {
    /// One probe of `vm` answered `healthy`: `true` when `vm` has now failed
    /// [`UNHEALTHY_AFTER`] probes in a row and counts as dead (its marks are cleared).
    pub(super) fn probed(&mut self, vm: VmId, healthy: bool) -> bool {
        if healthy {
            self.failures.remove(&vm);
            return false;
        }
        let n = self.failures.entry(vm).or_default();
        *n += 1;
        if *n >= UNHEALTHY_AFTER {
            self.failures.remove(&vm);
            return true;
        }
        false
    }
}

/// Wall-clock seconds since the Unix epoch, for `/status` readers (not a timer).
fn unix_seconds() -> u64 {
    #[allow(clippy::disallowed_methods)]
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
