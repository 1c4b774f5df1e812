//! `vm_pool: {type: ec2}`: VMs are EC2 instances launched and terminated through the EC2
//! API with `aws-sdk-ec2`. Built with the `aws` cargo feature only.
//!
//! * **Credentials** come only from `aws-config`'s default chain; the region and an
//!   optional endpoint URL come from the config ([`Ec2VmPoolConfig`]).
//! * **Launch**: one RunInstances call per VM (MinCount = MaxCount = 1) from the launch
//!   template or image + instance type, with shutdown behaviour `terminate`, a client
//!   token (one gateway: `spillway-RUN-VM-N`, RUN this process's random id; under
//!   coordination `spw-POOL-TERM-VM-N`, [`term_token_stem`]: POOL = [`pool_token_id`]
//!   of `pool_name` and the gateway id, TERM the leader's term, VM the controller's VM
//!   id; N the subnet attempt; at most 64 ASCII characters), and the tags `spillway:pool=<pool_name>`, `spillway:vm=<vm id>`,
//!   `spillway:gateway=<gateway id>` ([`SPILLWAY_TAG_KEYS`]) plus the configured extra
//!   tags on the instance, its volumes and network interfaces. Subnets are used
//!   round-robin. A **capacity** error (no capacity, instance type not offered in that
//!   zone — `Unsupported` —, subnet out of addresses) moves the same launch on to the next
//!   subnet; an account **quota** (`InstanceLimitExceeded`, `VcpuLimitExceeded`) does not,
//!   as no subnet would help.
//! * **Ambiguous launches** (the reply was lost — the connection closed or broke after
//!   the request was written —, timed out, or was a 5xx: the instance may exist): the
//!   same RunInstances call — same client token, same subnet, same parameters — is
//!   repeated with back-off ([`RUN_RECOVERY_ATTEMPTS`]), EC2's documented idempotent
//!   recovery: it returns the instance the first call launched, or launches it now. Only
//!   a request that never left (no connection, [`super::aws_http::never_sent`]) is a
//!   definite failure. When every repetition is ambiguous too, DescribeInstances looks
//!   the token up (with back-off) and the instance found, if any, becomes the launch's
//!   VM. Every token is recorded while its launch runs and, when the launch gives up,
//!   afterwards: an instance that turns up later with it is adopted by the audit.
//! * **Address resolution** ([`VmProvider::resolve`], polled by the driver every
//!   `probe_interval_seconds` per booting VM) reads a shared snapshot: one
//!   DescribeInstances call (by `instance-id` filter, which unlike `InstanceIds` does
//!   not fail on ids EC2 does not show yet) for every booting instance at once, about
//!   one per probe interval whatever the number of booting instances (plus one when a
//!   new instance appears), and none while backing off after throttling
//!   (`RequestLimitExceeded`: the pause starts at the probe interval and doubles up to
//!   [`DESCRIBE_BACKOFF_MAX`]). The address is the private or public IPv4 plus
//!   `upstream_port`, or the URL in the `upstream_tag_key` tag (`address: tag`). The tag
//!   is the resolution seam for port mappings and for dry runs against an emulator whose
//!   instance addresses are fake: the instance's boot script (or a test standing in for
//!   it) writes its reachable URL with CreateTags, and the gateway never connects
//!   anywhere else. The resolved URL is cached. The driver then probes `health_path`
//!   until 2xx; an instance not ready within `boot_timeout_seconds` is terminated.
//! * **Termination** (scale-in after draining, boot timeout, shutdown, stale instances):
//!   TerminateInstances in batches, retried with back-off on transient errors. EC2 is
//!   eventually consistent: `InvalidInstanceID.NotFound` right after RunInstances does
//!   not mean "gone". The ids the error names are taken out of the batch (the rest is
//!   terminated at once) and confirmed one by one: DescribeInstances with back-off, then
//!   TerminateInstances again while the instance is visible and not terminated, for up
//!   to [`TERMINATE_CONFIRM_FOR`]. An instance never confirmed stays tracked and the
//!   pool audit tries again.
//! * **One writer per pool's instances**: every instance carries this
//!   gateway's id ([`effective_gateway_id`]: `gateway_id`, else the coordination cluster
//!   name, else the `pool_name`; never the host name, so a restarted gateway finds its
//!   pool). At start — after listing the pool with back-off for at most
//!   [`ADOPT_LIST_FOR`] (the gateway listens once adoption ends), before anything is
//!   launched —, instances of the pool
//!   with this id (or one of `adopt_gateway_ids`, or no id: launched before the tag
//!   existed) are this gateway's: those that are `running`, resolve and pass one health
//!   probe are adopted as ready VMs; the others — booting, unhealthy, `stopping` or
//!   `stopped` — are terminated, except, in a pool shared by coordinated replicas, a
//!   `pending` or `running` one: it may be a replica's launch still booting, which the
//!   leader adopts (replay or audit). Instances of other gateway ids are never adopted or
//!   terminated; `/status` lists them per id (`vm_pool.errors.conditions.other_gateways`).
//! * **Pool audit**, every `audit_interval_seconds` (one listing of the pool in every
//!   state): terminates this gateway's `stopped` instances, retries unconfirmed
//!   terminations, and
//!   * raises the alarm `pool_writers` when an instance with this gateway's id that this
//!     run did not launch (its client token is not this run's) was launched after this
//!     run started — a second live gateway writing the pool with the same id. Its
//!     instances are left alone;
//!   * adopts (as a ready VM, through [`VmProvider::take_pool_changes`]) an untracked
//!     running instance whose client token is one of a launch this run gave up on,
//!     once its address passes the policy and one health probe answers 2xx; a launch
//!     still in flight is never touched;
//!   * raises the alarm `stray_instances` for any other untracked instance of this
//!     gateway (its id, an adopted id, or none) — an earlier run's that adoption did
//!     not see — and terminates it once seen for `stray_grace_seconds`;
//!   * reports a tracked instance that EC2 shows `shutting-down`, `terminated`,
//!     `stopping` or `stopped`, or no longer lists in [`GONE_AFTER_MISSED_AUDITS`]
//!     audits, as gone: its VM leaves the pool whatever still answers at its address,
//!     and resolving it fails.
//!
//!   Under coordination (`shared`) the replicas share one id: no `pool_writers` alarm
//!   and no stray termination; a running, healthy instance this replica does not track
//!   is offered to the driver ([`PoolChanges::unclaimed`]), and the leader adopts it
//!   unless one of its VMs (its own, or the registry's) is that instance — a launch of
//!   an earlier leader that got ready after that leader stopped is not lost. Every
//!   listing notes the highest leader term in the pool's client tokens
//!   ([`VmProvider::highest_term`]: a lease is asked above it).
//! * **A new leader's replay** (`crate::coord`): the launch intent of an earlier term
//!   that has no recorded outcome names its token stem; [`VmProvider::recover_launch`]
//!   lists the pool's live instances by tag once and matches their client tokens
//!   (`STEM-N`, any subnet attempt): running, passing the address policy and one health
//!   probe → adopted as ready; pending or not healthy yet → adopted as a booting VM the
//!   driver waits for (resolution and probes, as for its own launch); none → the launch
//!   is dropped. A launch's intent stays open until its VM is ready or given up, so a
//!   launch still booting when its leader stopped is replayed this way. (DescribeInstances' `client-token` filter would need one value per
//!   attempt, and moto does not implement it.)
//! * **Shutdown**: `on_shutdown: keep` (default) leaves the pool's VMs for the next run to
//!   adopt (instances being terminated are still terminated); `terminate` terminates
//!   every instance this run launched or adopted.
//! * **Failures** (capacity, quota, throttling, access denied, unreachable endpoint,
//!   timeouts) never crash the gateway: each is logged, counted in
//!   `spillway_provider_errors_total{provider="ec2"}` and shown in `/status`
//!   (`vm_pool.errors`, via [`ProviderErrors`]). A launch failure that retrying cannot fix
//!   — access denied (`UnauthorizedOperation`, e.g. an IAM image condition that no longer
//!   matches the template's AMI), an exhausted quota, an invalid request — is also the
//!   alarm `launch` (`vm_pool.errors.conditions.launch`) until a launch succeeds. The
//!   controller serves with the VMs that are ready and spills the rest to the function
//!   tier; adoption listings that all fail start the gateway with no adopted VM and the
//!   alarm `adoption` until the audit lists the pool.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, IamInstanceProfileSpecification, Instance, InstanceStateName, InstanceType,
    LaunchTemplateSpecification, ResourceType, ShutdownBehavior, Tag, TagSpecification,
};
use base64::Engine as _;
use http::Uri;
use tokio::time::Instant;

use super::provider_errors::{ErrorKind, ProviderErrorStats, ProviderErrors};
use super::{BackendError, BoxFuture, PoolChanges, Recovered, VmProvider};
use crate::config::{EC2_POOL_TAG_KEY, Ec2Address, Ec2ShutdownPolicy, Ec2VmPoolConfig, HttpUrl};
use crate::net::client::UpstreamClient;
use crate::policy::VmId;

/// Tag carrying the controller's VM id (`vm-3`) on instances this gateway launched.
pub const EC2_VM_TAG_KEY: &str = "spillway:vm";
/// Tag carrying the launching gateway's id (`vm_pool.gateway_id`).
pub const EC2_GATEWAY_TAG_KEY: &str = "spillway:gateway";
/// Every tag key spillway itself sets at RunInstances (plus the `vm_pool.tags` keys).
/// `deploy/aws/iam.yaml` allows exactly these in its `aws:TagKeys` condition (checked
/// by `tests/aws_ec2.rs`).
pub const SPILLWAY_TAG_KEYS: [&str; 3] = [EC2_POOL_TAG_KEY, EC2_VM_TAG_KEY, EC2_GATEWAY_TAG_KEY];
/// TerminateInstances attempts on transient errors (each with the SDK's own retries)
/// before giving up until the next audit.
pub const TERMINATE_ATTEMPTS: u32 = 5;
/// First back-off between TerminateInstances attempts; doubles each time.
pub const TERMINATE_BACKOFF: Duration = Duration::from_millis(500);
/// How long an instance that EC2 reports as not found is re-checked (DescribeInstances,
/// TerminateInstances again) before the pool audit takes over; pauses start at
/// [`TERMINATE_BACKOFF`] and double up to [`CONFIRM_BACKOFF_MAX`].
pub const TERMINATE_CONFIRM_FOR: Duration = Duration::from_secs(120);
/// How long the gateway's shutdown waits for EC2 to confirm terminations it did not
/// find at once (the next start or audit handles the rest).
pub const SHUTDOWN_CONFIRM_FOR: Duration = Duration::from_secs(10);
/// Longest pause between two checks of an unconfirmed termination.
pub const CONFIRM_BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Most ids per TerminateInstances call.
pub const TERMINATE_BATCH: usize = 1000;
/// Repetitions of an ambiguous RunInstances call with the same client token.
pub const RUN_RECOVERY_ATTEMPTS: u32 = 4;
/// First pause before repeating an ambiguous RunInstances call; doubles each time.
pub const RUN_RECOVERY_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between DescribeInstances calls while the API throttles.
pub const DESCRIBE_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// How long the pool is listed at start, with back-off, before the gateway starts
/// without adopted VMs (each listing with the SDK's own retries, a listing still
/// running at the end is dropped): nothing is launched before adoption has listed the
/// pool or given up, and the gateway does not listen before, so this bounds how long
/// an unreachable EC2 API delays serving on the function tier.
pub const ADOPT_LIST_FOR: Duration = Duration::from_secs(12);
/// First pause between two adoption listings; doubles up to [`ADOPT_LIST_BACKOFF_MAX`].
pub const ADOPT_LIST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between two adoption listings.
pub const ADOPT_LIST_BACKOFF_MAX: Duration = Duration::from_secs(8);
/// Pool audits in a row that must miss a resolved instance (EC2 lists terminated
/// instances for about an hour, then forgets them) before it counts as gone.
pub const GONE_AFTER_MISSED_AUDITS: u32 = 2;
/// Most values per DescribeInstances filter (EC2's limit is 200).
pub const DESCRIBE_FILTER_VALUES: usize = 200;
/// Connect timeout towards the EC2 endpoint.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Timeout of one EC2 API call attempt.
pub const API_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of one EC2 API call, retries included.
pub const API_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per EC2 API call, the SDK's standard retry mode (throttling, 5xx, I/O).
/// The batched DescribeInstances of address resolution makes one attempt and backs off
/// itself.
pub const API_MAX_ATTEMPTS: u32 = 3;

const PROVIDER: &str = "ec2";
const OP_RUN: &str = "run_instances";
const OP_DESCRIBE: &str = "describe_instances";
const OP_TERMINATE: &str = "terminate_instances";
const NOT_FOUND: &str = "InvalidInstanceID.NotFound";
const MALFORMED: &str = "InvalidInstanceID.Malformed";
/// `/status` condition: the last launch failed in a way retrying cannot fix.
const COND_LAUNCH: &str = "launch";
/// `/status` condition: another live gateway launches with this gateway's id.
const COND_WRITERS: &str = "pool_writers";
/// `/status` condition: instances of the pool that belong to other gateway ids.
const COND_OTHERS: &str = "other_gateways";
/// Condition: an instance's upstream address was refused by the address policy:
/// the instance was not used. An alarm (a tag pointing at the metadata
/// service is an attack or a broken boot script); it stays until a restart.
const COND_ADDRESS: &str = "upstream_address";
/// Alarm: the pool could not be listed at start; instances of an earlier run may run
/// untracked until the audit finds them (then `stray_instances`).
const COND_ADOPTION: &str = "adoption";
/// Alarm: instances of this gateway's pool that no VM stands for (not adopted at start,
/// not launched by this run); terminated after `stray_grace_seconds`.
const COND_STRAYS: &str = "stray_instances";

/// What the provider knows about one of its instances.
#[derive(Clone, Debug, Default)]
struct Tracked {
    /// Resolved upstream URL, cached once known.
    base: Option<Uri>,
    /// Termination was asked for and is not confirmed yet.
    terminating: bool,
    /// Since when EC2 has said "not found" for it, while terminating.
    missing_since: Option<Instant>,
    /// Pool audits in a row whose listing did not show it (once resolved).
    missing_audits: u32,
}

/// Where a RunInstances client token of this run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launch {
    /// The call (or its recovery) is still running: the audit leaves an instance with
    /// this token alone.
    InFlight,
    /// The launch gave up with its outcome unknown or failed: an instance that turns
    /// up with this token is this gateway's, adopted by the audit when healthy.
    GaveUp,
}

/// The shared DescribeInstances snapshot of address resolution.
#[derive(Debug, Default)]
struct Snapshot {
    /// Instances of the last call, by id.
    seen: HashMap<String, Instance>,
    /// Ids the last call asked for.
    asked: HashSet<String>,
    /// When the last call ended.
    at: Option<Instant>,
    /// Current throttling back-off (zero when not throttled).
    backoff: Duration,
    /// No call before this instant (throttling back-off).
    blocked_until: Option<Instant>,
}

/// An EC2 VM pool. See the [module docs](self).
#[derive(Debug)]
pub struct Ec2VmPool {
    pool: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    client: Client,
    cfg: Ec2VmPoolConfig,
    http: UpstreamClient,
    run_id: u64,
    gateway_id: String,
    /// [`pool_token_id`] of this pool and gateway id.
    token_pool: u32,
    /// The highest leader term seen in the pool's client tokens ([`parse_term_token`]).
    highest_term: AtomicU64,
    /// Wall-clock start of this run, seconds since the Unix epoch (EC2 launch times are
    /// wall-clock too).
    started_unix: i64,
    next_subnet: AtomicUsize,
    instances: Mutex<HashMap<String, Tracked>>,
    snapshot: tokio::sync::Mutex<Snapshot>,
    probe_interval: Duration,
    closed: AtomicBool,
    errors: ProviderErrors,
    /// `gateway.allow_loopback_upstreams`: loopback instance addresses are accepted.
    allow_loopback: bool,
    /// Instances whose address the policy refused, and the last one's id.
    refused: Mutex<(u64, String)>,
    /// The pool is shared by coordinated replicas (one `gateway_id` for all): the audit
    /// raises no `pool_writers` alarm and terminates no stray instance (another
    /// replica's launch is not a stray).
    shared: bool,
    /// Client tokens of this run's RunInstances calls still in flight or given up.
    launches: Mutex<HashMap<String, Launch>>,
    /// What the audit found for the driver ([`VmProvider::take_pool_changes`]).
    changes: Mutex<PoolChanges>,
    /// Instances EC2 reports gone (terminated outside the gateway).
    gone: Mutex<HashSet<String>>,
    /// Untracked instances of this gateway's pool, and since when the audit sees them.
    strays: Mutex<HashMap<String, Instant>>,
    /// `vm_pool.stray_grace_seconds`.
    stray_grace: Duration,
    /// Without `vm_pool.gateway_id`: the host name, the default id of earlier versions,
    /// whose instances are this gateway's too (an upgrade keeps its pool).
    legacy_id: Option<String>,
}

/// The pool's writer id: `vm_pool.gateway_id`, else (under coordination the config
/// sets it to the cluster name) the `pool_name`. Never the host name: a restarted or
/// rescheduled gateway must find its own instances again.
pub fn effective_gateway_id(cfg: &Ec2VmPoolConfig) -> String {
    cfg.gateway_id
        .clone()
        .unwrap_or_else(|| cfg.pool_name.clone())
}

/// The host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`), the default
/// `gateway_id` of earlier versions: without `vm_pool.gateway_id`, instances tagged with
/// it are adopted like this gateway's own, so an upgraded gateway keeps the pool its
/// previous version launched.
pub fn legacy_gateway_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().chars().take(128).collect::<String>())
        .filter(|h| !h.is_empty())
}

impl Ec2VmPool {
    /// Load the AWS SDK configuration (default credential chain; region and endpoint from
    /// `cfg`) and build the pool. `http` is the gateway's upstream client, used for the
    /// health probe of instances found at start. `allow_loopback`
    /// (`gateway.allow_loopback_upstreams`) accepts loopback instance addresses
    /// (link-local and metadata addresses are always refused). No API call is
    /// made here. `shared`: the pool is written by coordinated replicas under one id
    /// (no `pool_writers` alarm, no stray termination by the audit).
    ///
    /// # Errors
    /// [`BackendError::Provider`] when no region is configured anywhere
    /// (`vm_pool.region`, `AWS_REGION`, the profile).
    pub async fn new(
        cfg: &Ec2VmPoolConfig,
        http: UpstreamClient,
        allow_loopback: bool,
        shared: bool,
    ) -> Result<Self, BackendError> {
        let sdk = super::aws_sdk::load(
            "ec2",
            "vm_pool",
            cfg.region.as_deref(),
            cfg.endpoint_url.as_ref().map(HttpUrl::as_str),
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(API_CONNECT_TIMEOUT)
                .operation_attempt_timeout(API_ATTEMPT_TIMEOUT)
                .operation_timeout(API_OPERATION_TIMEOUT)
                .build(),
            aws_config::retry::RetryConfig::standard().with_max_attempts(API_MAX_ATTEMPTS),
        )
        .await?;
        // A wall-clock start time, compared with EC2's launch times; not a timer.
        #[allow(clippy::disallowed_methods)]
        let started_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Ok(Self {
            pool: Arc::new(Pool {
                client: Client::new(&sdk),
                gateway_id: effective_gateway_id(cfg),
                token_pool: pool_token_id(&cfg.pool_name, &effective_gateway_id(cfg)),
                highest_term: AtomicU64::new(0),
                cfg: cfg.clone(),
                http,
                run_id: rand::random(),
                started_unix,
                next_subnet: AtomicUsize::new(0),
                instances: Mutex::new(HashMap::new()),
                snapshot: tokio::sync::Mutex::new(Snapshot::default()),
                probe_interval: cfg.probe_interval_seconds.get(),
                closed: AtomicBool::new(false),
                errors: ProviderErrors::new(PROVIDER),
                allow_loopback,
                refused: Mutex::new((0, String::new())),
                shared,
                launches: Mutex::new(HashMap::new()),
                changes: Mutex::new(PoolChanges::default()),
                gone: Mutex::new(HashSet::new()),
                strays: Mutex::new(HashMap::new()),
                stray_grace: cfg.stray_grace_seconds.get(),
                legacy_id: if cfg.gateway_id.is_none() {
                    legacy_gateway_id()
                } else {
                    None
                },
            }),
        })
    }

    /// Instances currently managed (launched or adopted, not terminated), sorted.
    pub fn managed(&self) -> Vec<String> {
        self.pool.managed()
    }

    /// This gateway's id in the pool ([`effective_gateway_id`]).
    pub fn gateway_id(&self) -> &str {
        &self.pool.gateway_id
    }
}

impl Pool {
    fn managed(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, t)| !t.terminating)
            .map(|(id, _)| id.clone())
            .collect();
        v.sort();
        v
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Tracked>> {
        self.instances.lock()
    }

    fn launches(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Launch>> {
        self.launches.lock()
    }

    fn is_gone(&self, id: &str) -> bool {
        self.gone.lock().contains(id)
    }

    /// The client-token prefix of this run's launches (one gateway, no leader term).
    fn token_prefix(&self) -> String {
        format!("spillway-{:016x}-", self.run_id)
    }

    /// The client-token stem of a launch of `vm` in leader term `term`
    /// ([`term_token_stem`]).
    fn launch_stem(&self, vm: VmId, term: u64) -> String {
        term_token_stem(self.token_pool, term, vm)
    }

    /// Raise [`Pool::highest_term`] to the terms the client tokens of `found` carry.
    fn note_terms(&self, found: &[Instance]) {
        let top = found
            .iter()
            .filter_map(|i| parse_term_token(i.client_token()?))
            .filter(|(pool, _, _)| *pool == self.token_pool)
            .map(|(_, term, _)| term)
            .max()
            .unwrap_or(0);
        self.highest_term.fetch_max(top, Ordering::Relaxed);
    }

    /// The instance of an earlier leader's launch, by its client-token stem (see
    /// [`VmProvider::recover_launch`]): one listing of the pool's live instances by tag,
    /// matched on their client tokens (every subnet attempt's, `STEM-N`).
    /// DescribeInstances' `client-token` filter would take one value per attempt; moto
    /// does not implement it, and the pool listing is one call whatever the subnets.
    async fn recover_launch(&self, stem: &str) -> Result<Recovered, BackendError> {
        let found = self
            .list_pool(&["pending", "running"])
            .await
            .map_err(|()| {
                BackendError::Provider(format!(
                    "ec2: cannot list pool {} to find the launch {stem}",
                    self.cfg.pool_name
                ))
            })?;
        let prefix = format!("{stem}-");
        let mine: Vec<&Instance> = found
            .iter()
            .filter(|i| i.client_token().is_some_and(|t| t.starts_with(&prefix)))
            .collect();
        let Some(inst) = mine
            .iter()
            .find(|i| state_of(i) == InstanceStateName::Running)
            .or_else(|| mine.first())
        else {
            return Ok(Recovered::Missing);
        };
        let id = inst.instance_id().unwrap_or_default().to_owned();
        if state_of(inst) != InstanceStateName::Running {
            return Ok(Recovered::Booting(id));
        }
        match self.address(inst) {
            Ok(Some(base)) if self.http.probe(&base, &self.cfg.health_path).await => {
                Ok(Recovered::Ready(id, base))
            }
            _ => Ok(Recovered::Booting(id)),
        }
    }

    fn tag_specifications(&self, vm: VmId) -> Vec<TagSpecification> {
        let mut tags = vec![
            tag(EC2_POOL_TAG_KEY, &self.cfg.pool_name),
            tag(EC2_VM_TAG_KEY, &vm.to_string()),
            tag(EC2_GATEWAY_TAG_KEY, &self.gateway_id),
        ];
        tags.extend(self.cfg.tags.iter().map(|(k, v)| tag(k, v)));
        [
            ResourceType::Instance,
            ResourceType::Volume,
            ResourceType::NetworkInterface,
        ]
        .into_iter()
        .map(|rt| {
            TagSpecification::builder()
                .resource_type(rt)
                .set_tags(Some(tags.clone()))
                .build()
        })
        .collect()
    }

    /// One RunInstances call for `vm` into `subnet` with client token `token`.
    async fn run_one(
        &self,
        vm: VmId,
        subnet: Option<&str>,
        token: &str,
    ) -> Result<String, SdkError<aws_sdk_ec2::operation::run_instances::RunInstancesError>> {
        let c = &self.cfg;
        let mut req = self
            .client
            .run_instances()
            .min_count(1)
            .max_count(1)
            .client_token(token)
            .instance_initiated_shutdown_behavior(ShutdownBehavior::Terminate)
            .set_tag_specifications(Some(self.tag_specifications(vm)))
            .set_subnet_id(subnet.map(str::to_string))
            .set_image_id(c.image_id.clone())
            .set_instance_type(c.instance_type.as_deref().map(InstanceType::from));
        if let Some(t) = &c.launch_template {
            req = req.launch_template(
                LaunchTemplateSpecification::builder()
                    .set_launch_template_id(t.id.clone())
                    .set_launch_template_name(t.name.clone())
                    .set_version(t.version.clone())
                    .build(),
            );
        }
        if !c.security_group_ids.is_empty() {
            req = req.set_security_group_ids(Some(c.security_group_ids.clone()));
        }
        if let Some(p) = &c.instance_profile {
            let spec = IamInstanceProfileSpecification::builder();
            req = req.iam_instance_profile(if p.starts_with("arn:") {
                spec.arn(p).build()
            } else {
                spec.name(p).build()
            });
        }
        if let Some(ud) = &c.user_data {
            req = req.user_data(base64::engine::general_purpose::STANDARD.encode(ud));
        }
        let out = req.send().await?;
        let id = out
            .instances()
            .iter()
            .find_map(|i| i.instance_id())
            .unwrap_or_default()
            .to_string();
        Ok(id)
    }

    /// RunInstances with EC2's idempotent recovery (see the [module docs](self)):
    /// `Ok(Some(id))` launched, `Ok(None)` the outcome stayed unknown and no instance
    /// carries the token, `Err` a definite failure.
    async fn run_recovering(
        &self,
        vm: VmId,
        subnet: Option<&str>,
        token: &str,
    ) -> Result<Option<String>, SdkError<aws_sdk_ec2::operation::run_instances::RunInstancesError>>
    {
        let mut pause = RUN_RECOVERY_BACKOFF;
        for attempt in 0..=RUN_RECOVERY_ATTEMPTS {
            match self.run_one(vm, subnet, token).await {
                Ok(id) => return Ok(Some(id)),
                Err(e) if may_have_launched(&e) => {
                    self.errors
                        .record(OP_RUN, classify(&e), DisplayErrorContext(&e));
                    if attempt < RUN_RECOVERY_ATTEMPTS {
                        tracing::warn!(%vm, token, subnet = subnet.unwrap_or("-"), "RunInstances outcome unknown; repeating it with the same client token");
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.find_by_token(token).await)
    }

    /// The pending or running instance that carries client token `token`, looked up a
    /// few times with back-off (EC2 may not show it at once).
    async fn find_by_token(&self, token: &str) -> Option<String> {
        let mut pause = RUN_RECOVERY_BACKOFF;
        for round in 0..3 {
            if round > 0 {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            let found = self
                .client
                .describe_instances()
                .filters(filter("client-token", [token]))
                .send()
                .await;
            match found {
                Ok(out) => {
                    let alive = out
                        .reservations()
                        .iter()
                        .flat_map(|r| r.instances())
                        .filter(|i| {
                            matches!(
                                state_of(i),
                                InstanceStateName::Pending | InstanceStateName::Running
                            )
                        })
                        .find_map(|i| i.instance_id().map(str::to_owned));
                    if alive.is_some() {
                        return alive;
                    }
                }
                Err(e) => self
                    .errors
                    .record(OP_DESCRIBE, classify(&e), DisplayErrorContext(&e)),
            }
        }
        tracing::warn!(
            token,
            "a RunInstances call may have left an instance; it carries the pool tag and the audit or the next start handles it"
        );
        None
    }

    async fn launch_vm(&self, vm: VmId, term: Option<u64>) -> Result<String, BackendError> {
        let subnets = &self.cfg.subnet_ids;
        let attempts = subnets.len().max(1);
        let first = self.next_subnet.fetch_add(1, Ordering::Relaxed);
        let mut last_error = String::new();
        for i in 0..attempts {
            let subnet =
                (!subnets.is_empty()).then(|| subnets[(first + i) % subnets.len()].as_str());
            // A client token is bound to its parameters: one per subnet attempt.
            let token = match term {
                Some(t) => format!("{}-{i}", self.launch_stem(vm, t)),
                None => format!("{}{vm}-{i}", self.token_prefix()),
            };
            self.launches().insert(token.clone(), Launch::InFlight);
            let outcome = self.run_recovering(vm, subnet, &token).await;
            // Tracked by id from here on (tracked first: the audit never sees it
            // untracked and unrecorded), or adoptable by the audit should an instance
            // with this token turn up after all.
            match &outcome {
                Ok(Some(id)) if !id.is_empty() => {
                    self.lock().insert(id.clone(), Tracked::default());
                    self.launches().remove(&token);
                }
                _ => {
                    self.launches().insert(token.clone(), Launch::GaveUp);
                }
            }
            match outcome {
                Ok(Some(id)) if !id.is_empty() => {
                    self.errors.clear_condition(COND_LAUNCH);
                    tracing::info!(%vm, instance = %id, subnet = subnet.unwrap_or("-"), pool = %self.cfg.pool_name, "EC2 instance launched");
                    return Ok(id);
                }
                Ok(Some(_)) => {
                    self.errors.record(
                        OP_RUN,
                        ErrorKind::Other,
                        "RunInstances returned no instance",
                    );
                    return Err(BackendError::Provider(
                        "ec2: RunInstances returned no instance".into(),
                    ));
                }
                Ok(None) => {
                    return Err(BackendError::OutcomeUnknown(format!(
                        "ec2: RunInstances outcome unknown after {RUN_RECOVERY_ATTEMPTS} repetitions (client token {token})"
                    )));
                }
                Err(e) => {
                    let kind = classify(&e);
                    let msg = DisplayErrorContext(&e).to_string();
                    self.errors.record(OP_RUN, kind, &msg);
                    if matches!(
                        kind,
                        ErrorKind::AccessDenied | ErrorKind::Quota | ErrorKind::InvalidRequest
                    ) {
                        self.errors.set_condition(
                            COND_LAUNCH,
                            kind.as_str(),
                            true,
                            Some(format!(
                                "RunInstances fails and retrying cannot fix it; the pool cannot grow: {msg}"
                            )),
                            serde_json::Map::new(),
                        );
                    }
                    last_error = format!("ec2: RunInstances failed ({}): {msg}", kind.as_str());
                    if kind == ErrorKind::Capacity && i + 1 < attempts {
                        tracing::info!(%vm, "no capacity for the launch in subnet {}; trying the next one", subnet.unwrap_or("-"));
                        continue;
                    }
                    break;
                }
            }
        }
        Err(BackendError::Provider(last_error))
    }

    /// The instance `id` as the shared snapshot shows it, refreshing the snapshot (one
    /// batched DescribeInstances for every unresolved instance) when it is older than
    /// 0.9 probe intervals or does not cover `id`, unless throttling back-off holds.
    async fn observe(&self, id: &str) -> Option<Instance> {
        let mut snap = self.snapshot.lock().await;
        let now = Instant::now();
        let fresh = snap.asked.contains(id)
            && snap
                .at
                .is_some_and(|at| now.duration_since(at) < self.probe_interval / 10 * 9);
        let blocked = snap.blocked_until.is_some_and(|until| now < until);
        if !fresh && !blocked {
            let mut ids: Vec<String> = self
                .lock()
                .iter()
                .filter(|(_, t)| t.base.is_none() && !t.terminating)
                .map(|(id, _)| id.clone())
                .collect();
            if !ids.iter().any(|i| i == id) {
                ids.push(id.to_owned());
            }
            ids.sort();
            let result = self.describe_ids(&ids, false).await;
            // Errors too count as this round: every resolver waits for the next one.
            snap.asked = ids.into_iter().collect();
            match result {
                Ok(found) => {
                    snap.seen = found;
                    snap.backoff = Duration::ZERO;
                    snap.blocked_until = None;
                }
                Err(ErrorKind::Throttling) => {
                    snap.backoff = if snap.backoff.is_zero() {
                        self.probe_interval.max(Duration::from_millis(100))
                    } else {
                        (snap.backoff * 2).min(DESCRIBE_BACKOFF_MAX)
                    };
                    // Up to a quarter more, so that gateways do not retry in step.
                    let jitter = rand::random_range(Duration::ZERO..=snap.backoff / 4);
                    snap.blocked_until = Some(Instant::now() + snap.backoff + jitter);
                    tracing::warn!(backoff = ?snap.backoff, "DescribeInstances throttled; backing off");
                }
                Err(_) => {}
            }
            snap.at = Some(Instant::now());
        }
        snap.seen.get(id).cloned()
    }

    /// DescribeInstances for `ids` by `instance-id` filter (ids EC2 does not show yet are
    /// simply absent), in chunks of [`DESCRIBE_FILTER_VALUES`], every page. `retry`:
    /// the SDK's standard retries; else one attempt (the caller backs off itself).
    async fn describe_ids(
        &self,
        ids: &[String],
        retry: bool,
    ) -> Result<HashMap<String, Instance>, ErrorKind> {
        let mut found = HashMap::new();
        for chunk in ids.chunks(DESCRIBE_FILTER_VALUES) {
            let mut next: Option<String> = None;
            loop {
                let mut call = self
                    .client
                    .describe_instances()
                    .filters(filter("instance-id", chunk.iter().map(String::as_str)))
                    .set_next_token(next.take())
                    .customize();
                if !retry {
                    call = call.config_override(
                        aws_sdk_ec2::config::Builder::default()
                            .retry_config(aws_config::retry::RetryConfig::disabled()),
                    );
                }
                match call.send().await {
                    Ok(out) => {
                        for inst in out.reservations().iter().flat_map(|r| r.instances()) {
                            if let Some(id) = inst.instance_id() {
                                found.insert(id.to_owned(), inst.clone());
                            }
                        }
                        match out.next_token() {
                            Some(t) if !t.is_empty() => next = Some(t.to_owned()),
                            _ => break,
                        }
                    }
                    Err(e) => {
                        let kind = classify(&e);
                        self.errors
                            .record(OP_DESCRIBE, kind, DisplayErrorContext(&e));
                        return Err(kind);
                    }
                }
            }
        }
        Ok(found)
    }

    /// Instances of the pool (every page) in the given states.
    async fn list_pool(&self, states: &[&str]) -> Result<Vec<Instance>, ()> {
        let mut all = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_instances()
                .filters(filter(
                    &format!("tag:{EC2_POOL_TAG_KEY}"),
                    [self.cfg.pool_name.as_str()],
                ))
                .filters(filter("instance-state-name", states.iter().copied()))
                .set_next_token(next.take())
                .send()
                .await;
            match out {
                Ok(out) => {
                    all.extend(
                        out.reservations()
                            .iter()
                            .flat_map(|r| r.instances())
                            .cloned(),
                    );
                    match out.next_token() {
                        Some(t) if !t.is_empty() => next = Some(t.to_string()),
                        _ => return Ok(all),
                    }
                }
                Err(e) => {
                    self.errors
                        .record(OP_DESCRIBE, classify(&e), DisplayErrorContext(&e));
                    return Err(());
                }
            }
        }
    }

    /// The upstream URL of `inst` per `vm_pool.address`; `Ok(None)` while unknown. An
    /// address the upstream policy refuses ([`instance_upstream`]) is an error, logged
    /// with the instance id and shown in `/status` (condition `upstream_address`): the
    /// instance is not used.
    fn address(&self, inst: &Instance) -> Result<Option<Uri>, String> {
        let url = self.raw_address(inst);
        let checked = url.map(|u| {
            let base = instance_upstream(&u, self.allow_loopback)?;
            if self.cfg.address == Ec2Address::Tag {
                check_tag_address(
                    &base,
                    &instance_ips(inst),
                    &self.cfg.tag_address_allowed_cidrs,
                )?;
            }
            Ok(base)
        });
        match checked {
            None => Ok(None),
            Some(Ok(base)) => Ok(Some(base)),
            Some(Err(reason)) => {
                let id = inst.instance_id().unwrap_or("?");
                tracing::error!(instance = %id, error = %reason, "EC2 instance address refused; the instance is not used");
                let (count, last) = {
                    let mut r = self.refused.lock();
                    r.0 += 1;
                    r.1 = id.to_owned();
                    r.clone()
                };
                let detail = [
                    (
                        "instances_refused".to_owned(),
                        serde_json::Value::from(count),
                    ),
                    ("last_instance".to_owned(), serde_json::Value::from(last)),
                ]
                .into_iter()
                .collect();
                self.errors.set_condition(
                    COND_ADDRESS,
                    "refused",
                    true,
                    Some(format!("instance {id}: {reason}")),
                    detail,
                );
                Err(reason)
            }
        }
    }

    /// The instance's upstream URL text per `vm_pool.address`, unchecked.
    fn raw_address(&self, inst: &Instance) -> Option<String> {
        let c = &self.cfg;
        match c.address {
            Ec2Address::PrivateIp => inst
                .private_ip_address()
                .map(|ip| format!("{}://{ip}:{}", c.scheme, c.upstream_port)),
            Ec2Address::PublicIp => inst
                .public_ip_address()
                .map(|ip| format!("{}://{ip}:{}", c.scheme, c.upstream_port)),
            Ec2Address::Tag => tag_value(inst, &c.upstream_tag_key).map(str::to_string),
        }
    }

    /// Which gateway an instance of the pool belongs to: `Ok(())` this one (its id, an
    /// id in `adopt_gateway_ids`, the host name when no `gateway_id` is set
    /// ([`legacy_gateway_id`]), or no id tag), `Err(other id)` another.
    fn owner(&self, inst: &Instance) -> Result<(), String> {
        match tag_value(inst, EC2_GATEWAY_TAG_KEY) {
            None => Ok(()),
            Some(g)
                if g == self.gateway_id
                    || self.cfg.adopt_gateway_ids.iter().any(|a| a == g)
                    || self.legacy_id.as_deref() == Some(g) =>
            {
                Ok(())
            }
            Some(g) => Err(g.to_owned()),
        }
    }

    /// Terminate `ids` (see the [module docs](self)): batches, transient errors retried
    /// with back-off, ids EC2 does not find confirmed one by one for up to `confirm_for`
    /// (zero: left to the next audit). Every id stays tracked as terminating until EC2
    /// confirms it.
    async fn terminate_ids(
        &self,
        ids: &[String],
        confirm_for: Duration,
    ) -> Result<(), BackendError> {
        {
            let mut map = self.lock();
            for id in ids {
                map.entry(id.clone()).or_default().terminating = true;
            }
        }
        let mut failed: Option<String> = None;
        let mut unconfirmed: Vec<String> = Vec::new();
        for chunk in ids.chunks(TERMINATE_BATCH) {
            let mut queue: Vec<Vec<String>> = vec![chunk.to_vec()];
            while let Some(batch) = queue.pop() {
                if batch.is_empty() {
                    continue;
                }
                match self.terminate_batch(&batch).await {
                    Ok(()) => {}
                    Err(TerminateError::NotFound(named)) => {
                        let named: Vec<String> =
                            named.into_iter().filter(|n| batch.contains(n)).collect();
                        if named.is_empty() {
                            if batch.len() == 1 {
                                unconfirmed.push(batch[0].clone());
                            } else {
                                // The error names no id of the batch: one call per id.
                                queue.extend(batch.into_iter().map(|id| vec![id]));
                            }
                        } else {
                            queue.push(batch.into_iter().filter(|b| !named.contains(b)).collect());
                            unconfirmed.extend(named);
                        }
                    }
                    Err(TerminateError::Failed(msg)) => failed = Some(msg),
                }
            }
        }
        for id in unconfirmed {
            if let Err(e) = self.confirm_terminated(&id, confirm_for).await {
                failed = Some(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(msg) => {
                tracing::error!(instances = ?ids, "EC2 instances may still be running; they stay tracked and the pool audit terminates them");
                Err(BackendError::Provider(msg))
            }
        }
    }

    /// One TerminateInstances call for `batch`, retried with back-off on transient
    /// errors; terminated ids are no longer tracked.
    async fn terminate_batch(&self, batch: &[String]) -> Result<(), TerminateError> {
        let mut backoff = TERMINATE_BACKOFF;
        for attempt in 1..=TERMINATE_ATTEMPTS {
            let res = self
                .client
                .terminate_instances()
                .set_instance_ids(Some(batch.to_vec()))
                .send()
                .await;
            match res {
                Ok(_) => {
                    let mut map = self.lock();
                    for id in batch {
                        map.remove(id);
                    }
                    tracing::info!(instances = ?batch, "EC2 instances terminated");
                    return Ok(());
                }
                Err(e) if matches!(e.code(), Some(NOT_FOUND | MALFORMED)) => {
                    tracing::info!(instances = ?batch, error = %DisplayErrorContext(&e), "TerminateInstances: EC2 does not find some ids (yet)");
                    return Err(TerminateError::NotFound(instance_ids_in(
                        e.message().unwrap_or(""),
                    )));
                }
                Err(e) => {
                    let kind = classify(&e);
                    let msg = DisplayErrorContext(&e).to_string();
                    self.errors.record(OP_TERMINATE, kind, &msg);
                    if !kind.is_transient() || attempt == TERMINATE_ATTEMPTS {
                        return Err(TerminateError::Failed(format!(
                            "ec2: TerminateInstances failed ({}): {msg}",
                            kind.as_str()
                        )));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Confirm that `id`, which TerminateInstances did not find, is gone: DescribeInstances
    /// with back-off; terminated or shutting down → done; visible in another state →
    /// TerminateInstances again; not visible → wait (eventual consistency) and try both
    /// again, for up to `confirm_for`.
    async fn confirm_terminated(&self, id: &str, confirm_for: Duration) -> Result<(), String> {
        let started = Instant::now();
        if let Some(t) = self.lock().get_mut(id) {
            t.missing_since.get_or_insert(started);
        }
        if confirm_for.is_zero() {
            return Err(format!(
                "ec2: EC2 does not find {id} (yet); the pool audit retries its termination"
            ));
        }
        let mut pause = TERMINATE_BACKOFF;
        loop {
            let ids = [id.to_owned()];
            let seen = self.describe_ids(&ids, true).await;
            match seen.as_ref().ok().and_then(|m| m.get(id)) {
                Some(inst)
                    if matches!(
                        state_of(inst),
                        InstanceStateName::Terminated | InstanceStateName::ShuttingDown
                    ) =>
                {
                    self.lock().remove(id);
                    tracing::info!(instance = id, "EC2 instance termination confirmed");
                    return Ok(());
                }
                Some(_) => match self.terminate_batch(&ids).await {
                    Ok(()) => return Ok(()),
                    Err(TerminateError::NotFound(_)) => {}
                    Err(TerminateError::Failed(msg)) => return Err(msg),
                },
                None if seen.is_ok() => {
                    if let Ok(()) = self.terminate_batch(&ids).await {
                        return Ok(());
                    }
                }
                None => {}
            }
            if started.elapsed() + pause > confirm_for {
                let msg = format!(
                    "ec2: termination of {id} not confirmed within {confirm_for:?} (EC2 does not find it); the pool audit retries"
                );
                self.errors.record(OP_TERMINATE, ErrorKind::Other, &msg);
                return Err(msg);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CONFIRM_BACKOFF_MAX);
        }
    }

    /// Adoption at start (see the [module docs](self)): `(adopted, stale)`, the stale
    /// ones (this gateway's, not ready) to be terminated.
    async fn adopt_instances(&self) -> (Vec<(String, Uri)>, Vec<String>) {
        let Some(found) = self.list_pool_for_adoption().await else {
            tracing::error!(pool = %self.cfg.pool_name, tried_for = ?ADOPT_LIST_FOR, "cannot list the pool's instances; starting without adopted VMs (the pool audit terminates instances of an earlier run after stray_grace_seconds)");
            self.errors.set_condition(
                COND_ADOPTION,
                "listing_failed",
                true,
                Some(format!(
                    "the instances of pool {} could not be listed at start (tried for {ADOPT_LIST_FOR:?}); instances of an earlier run may be running untracked until the pool audit lists the pool",
                    self.cfg.pool_name
                )),
                serde_json::Map::new(),
            );
            return (Vec::new(), Vec::new());
        };
        self.note_terms(&found);
        let mut others: BTreeMap<String, u64> = BTreeMap::new();
        let mut checks = tokio::task::JoinSet::new();
        for inst in found {
            let Some(id) = inst.instance_id().map(str::to_string) else {
                continue;
            };
            if let Err(other) = self.owner(&inst) {
                tracing::info!(instance = %id, gateway = %other, "instance of another gateway: left alone");
                *others.entry(other).or_default() += 1;
                continue;
            }
            let running = state_of(&inst) == InstanceStateName::Running;
            // A shared pool's live instance that is not ready may be a replica's launch
            // still booting: the leader's, or an earlier leader's (its replay or the audit
            // adopts it); never terminated by a replica that starts.
            let spare = self.shared
                && matches!(
                    state_of(&inst),
                    InstanceStateName::Pending | InstanceStateName::Running
                );
            let base = if running {
                self.address(&inst).ok().flatten()
            } else {
                None
            };
            let http = self.http.clone();
            let path = self.cfg.health_path.clone();
            checks.spawn(async move {
                let ready = match &base {
                    Some(b) => http.probe(b, &path).await,
                    None => false,
                };
                (id, base.filter(|_| ready), spare)
            });
        }
        self.note_other_gateways(&others);
        let mut adopted = Vec::new();
        let mut stale = Vec::new();
        while let Some(joined) = checks.join_next().await {
            match joined {
                Ok((id, Some(base), _)) => adopted.push((id, base)),
                Ok((id, None, true)) => {
                    tracing::info!(instance = %id, "a shared pool's instance not ready at start: left to the leader (a replica's launch may still boot)");
                }
                Ok((id, None, false)) => stale.push(id),
                Err(e) => tracing::error!(error = %e, "adoption probe task failed"),
            }
        }
        adopted.sort_by(|a, b| a.0.cmp(&b.0));
        {
            let mut map = self.lock();
            for (id, base) in &adopted {
                map.insert(
                    id.clone(),
                    Tracked {
                        base: Some(base.clone()),
                        ..Tracked::default()
                    },
                );
            }
        }
        tracing::info!(pool = %self.cfg.pool_name, gateway_id = %self.gateway_id, adopted = adopted.len(), not_ready = stale.len(), other_gateways = others.values().sum::<u64>(), "EC2 adoption");
        stale.sort();
        (adopted, stale)
    }

    /// The pool's live instances for adoption at start: listings with back-off
    /// ([`ADOPT_LIST_BACKOFF`] doubling up to [`ADOPT_LIST_BACKOFF_MAX`], up to a quarter
    /// more as jitter) for at most [`ADOPT_LIST_FOR`]; `None` when none succeeded in
    /// time. The gateway launches nothing before this returns.
    async fn list_pool_for_adoption(&self) -> Option<Vec<Instance>> {
        let pool = &self.cfg.pool_name;
        retry_for(
            ADOPT_LIST_FOR,
            ADOPT_LIST_BACKOFF,
            ADOPT_LIST_BACKOFF_MAX,
            || self.list_pool(&["pending", "running", "stopping", "stopped"]),
            |attempt, pause| {
                tracing::warn!(%pool, attempt, backoff = ?pause, "cannot list the pool's instances for adoption; trying again before any launch");
            },
        )
        .await
    }

    /// `/status`: the pool's instances that belong to other gateway ids, per id.
    fn note_other_gateways(&self, others: &BTreeMap<String, u64>) {
        if others.is_empty() {
            self.errors.clear_condition(COND_OTHERS);
        } else {
            let detail = others
                .iter()
                .map(|(g, n)| (g.clone(), serde_json::Value::from(*n)))
                .collect();
            self.errors.set_condition(
                COND_OTHERS,
                "present",
                false,
                Some(format!(
                    "instances of pool {} launched by other gateways; this gateway ({}) leaves them alone",
                    self.cfg.pool_name, self.gateway_id
                )),
                detail,
            );
        }
    }

    /// One pool audit (see the [module docs](self)).
    async fn audit(&self) {
        let Ok(found) = self
            .list_pool(&[
                "pending",
                "running",
                "shutting-down",
                "terminated",
                "stopping",
                "stopped",
            ])
            .await
        else {
            return;
        };
        self.errors.clear_condition(COND_ADOPTION);
        self.note_terms(&found);
        let prefix = self.token_prefix();
        let now = Instant::now();
        let mut others: BTreeMap<String, u64> = BTreeMap::new();
        let mut to_terminate: Vec<String> = Vec::new();
        let mut twins: Vec<String> = Vec::new();
        let mut recovered: Vec<Instance> = Vec::new();
        let mut strays_seen: Vec<String> = Vec::new();
        let mut unclaimed: Vec<Instance> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        let visible: HashSet<String> = found
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        {
            let mut map = self.lock();
            let launches = self.launches().clone();
            for inst in &found {
                let Some(id) = inst.instance_id() else {
                    continue;
                };
                let state = state_of(inst);
                let up = matches!(
                    state,
                    InstanceStateName::Pending | InstanceStateName::Running
                );
                let live = up
                    || matches!(
                        state,
                        InstanceStateName::Stopping | InstanceStateName::Stopped
                    );
                match self.owner(inst) {
                    Err(other) => {
                        if live {
                            *others.entry(other).or_default() += 1;
                        }
                    }
                    Ok(()) => match map.get_mut(id) {
                        Some(t) if t.terminating => {
                            if live {
                                to_terminate.push(id.to_owned());
                            } else {
                                map.remove(id);
                            }
                        }
                        Some(t) => {
                            t.missing_audits = 0;
                            if !up {
                                // Terminated or stopped outside the gateway: its VM
                                // leaves the pool, whatever answers at its address.
                                gone.push(id.to_owned());
                                if live {
                                    to_terminate.push(id.to_owned());
                                }
                            }
                        }
                        None if !live => {}
                        None if state == InstanceStateName::Stopped => {
                            to_terminate.push(id.to_owned());
                        }
                        None => {
                            let token = inst.client_token().unwrap_or_default();
                            match launches.get(token) {
                                // A launch of this run still under way: never touched.
                                Some(Launch::InFlight) => {}
                                Some(Launch::GaveUp) => {
                                    if state == InstanceStateName::Running {
                                        recovered.push(inst.clone());
                                    }
                                }
                                None => {
                                    let ours = !token.is_empty() && token.starts_with(&prefix);
                                    let after_start = inst
                                        .launch_time()
                                        .is_some_and(|t| t.secs() > self.started_unix);
                                    let own_id = tag_value(inst, EC2_GATEWAY_TAG_KEY)
                                        == Some(&self.gateway_id);
                                    if ours {
                                        // Already being handled.
                                    } else if self.shared {
                                        // Another replica's; the leader adopts it when
                                        // no VM stands for it.
                                        if state == InstanceStateName::Running {
                                            unclaimed.push(inst.clone());
                                        }
                                    } else if own_id && after_start && up {
                                        twins.push(id.to_owned());
                                    } else {
                                        strays_seen.push(id.to_owned());
                                    }
                                }
                            }
                        }
                    },
                }
            }
            // Resolved instances EC2 no longer lists at all (it forgets terminated
            // ones after about an hour) are gone too.
            for (id, t) in map.iter_mut() {
                if !t.terminating && t.base.is_some() && !visible.contains(id) {
                    t.missing_audits += 1;
                    if t.missing_audits >= GONE_AFTER_MISSED_AUDITS {
                        gone.push(id.clone());
                    }
                }
            }
            for id in &gone {
                if !to_terminate.contains(id) {
                    map.remove(id);
                }
            }
        }
        self.note_other_gateways(&others);
        self.note_twins(twins);
        if !gone.is_empty() {
            gone.sort();
            tracing::warn!(instances = ?gone, pool = %self.cfg.pool_name, "EC2 reports these instances terminated or stopped outside the gateway; their VMs leave the pool");
            self.gone.lock().extend(gone.iter().cloned());
            self.changes.lock().gone.extend(gone);
        }
        to_terminate.extend(self.note_strays(&strays_seen, now));
        self.adopt_recovered(recovered).await;
        self.offer_unclaimed(unclaimed).await;
        // Terminations EC2 never confirmed and that it no longer lists are forgotten.
        {
            let mut map = self.lock();
            map.retain(|id, t| {
                let forget = t.terminating
                    && !visible.contains(id)
                    && t.missing_since
                        .is_some_and(|s| s.elapsed() > TERMINATE_CONFIRM_FOR);
                if forget {
                    tracing::warn!(instance = %id, "EC2 never listed this instance after its termination was asked for; forgetting it");
                }
                !forget
            });
        }
        if !to_terminate.is_empty() {
            to_terminate.sort();
            to_terminate.dedup();
            tracing::warn!(instances = ?to_terminate, "pool audit: terminating stopped and stray instances and unconfirmed terminations");
            let _ = self.terminate_ids(&to_terminate, Duration::ZERO).await;
        }
    }

    /// The `pool_writers` alarm: instances with this gateway's id that this run did
    /// not launch, launched after it started.
    fn note_twins(&self, mut twins: Vec<String>) {
        if twins.is_empty() {
            self.errors.clear_condition(COND_WRITERS);
            return;
        }
        twins.sort();
        let detail = [(
            "instances".to_owned(),
            serde_json::Value::from(twins.clone()),
        )]
        .into_iter()
        .collect();
        self.errors.set_condition(
            COND_WRITERS,
            "conflict",
            true,
            Some(format!(
                "another gateway launches into pool {} with this gateway's id {:?}; give each gateway its own vm_pool.gateway_id (its instances are left alone)",
                self.cfg.pool_name, self.gateway_id
            )),
            detail,
        );
    }

    /// The `stray_instances` alarm for the untracked instances of this gateway's pool
    /// the audit saw now (`seen`); returns those seen for `stray_grace_seconds` or
    /// longer, to be terminated. A stray that is no longer listed live is forgotten.
    fn note_strays(&self, seen: &[String], now: Instant) -> Vec<String> {
        let strays: Vec<(String, Instant)> = {
            let mut st = self.strays.lock();
            st.retain(|id, _| seen.contains(id));
            for id in seen {
                st.entry(id.clone()).or_insert(now);
            }
            let mut v: Vec<(String, Instant)> =
                st.iter().map(|(id, at)| (id.clone(), *at)).collect();
            v.sort();
            v
        };
        if strays.is_empty() {
            self.errors.clear_condition(COND_STRAYS);
            return Vec::new();
        }
        let due: Vec<String> = strays
            .iter()
            .filter(|(_, since)| now.duration_since(*since) >= self.stray_grace)
            .map(|(id, _)| id.clone())
            .collect();
        let ids: Vec<String> = strays.iter().map(|(id, _)| id.clone()).collect();
        tracing::error!(instances = ?ids, terminating = ?due, grace_seconds = self.stray_grace.as_secs_f64(), pool = %self.cfg.pool_name, "stray instances of this gateway's pool: not adopted at start and not launched by this run");
        let detail = [
            ("instances".to_owned(), serde_json::Value::from(ids)),
            (
                "terminating".to_owned(),
                serde_json::Value::from(due.clone()),
            ),
            (
                "grace_seconds".to_owned(),
                serde_json::Value::from(self.stray_grace.as_secs_f64()),
            ),
        ]
        .into_iter()
        .collect();
        self.errors.set_condition(
            COND_STRAYS,
            if due.is_empty() { "grace" } else { "terminating" },
            true,
            Some(format!(
                "instances of pool {} with this gateway's id ({}) that it neither adopted nor launched; each is terminated once the audit has seen it for vm_pool.stray_grace_seconds ({:?})",
                self.cfg.pool_name, self.gateway_id, self.stray_grace
            )),
            detail,
        );
        due
    }

    /// A shared pool's running instances that this replica does not track: those whose
    /// address passes the policy and that answer one health probe are offered to the
    /// driver ([`PoolChanges::unclaimed`]), which adopts them on the leader only (a
    /// follower's driver already has the leader's VMs from the registry).
    async fn offer_unclaimed(&self, unclaimed: Vec<Instance>) {
        for inst in unclaimed {
            let Some(id) = inst.instance_id().map(str::to_owned) else {
                continue;
            };
            let Ok(Some(base)) = self.address(&inst) else {
                continue;
            };
            if self.http.probe(&base, &self.cfg.health_path).await {
                let mut changes = self.changes.lock();
                if !changes.unclaimed.iter().any(|(queued, _)| *queued == id) {
                    changes.unclaimed.push((id, base));
                }
            }
        }
    }

    /// Instances of launches this run gave up on (outcome unknown) that turned up
    /// running: adopted as ready VMs when their address passes the policy and one
    /// health probe answers 2xx (else the next audit tries again; the boot timeout
    /// does not apply, an instance that never gets healthy stays until shutdown).
    async fn adopt_recovered(&self, recovered: Vec<Instance>) {
        for inst in recovered {
            let Some(id) = inst.instance_id().map(str::to_owned) else {
                continue;
            };
            let Ok(Some(base)) = self.address(&inst) else {
                continue;
            };
            if !self.http.probe(&base, &self.cfg.health_path).await {
                continue;
            }
            if let Some(token) = inst.client_token() {
                self.launches().remove(token);
            }
            self.lock().insert(
                id.clone(),
                Tracked {
                    base: Some(base.clone()),
                    ..Tracked::default()
                },
            );
            tracing::warn!(instance = %id, %base, "an instance of a launch whose outcome was unknown turned up; adopted as a ready VM");
            self.changes.lock().adopted.push((id, base));
        }
    }

    /// Resolve `instance` (see [`VmProvider::resolve`]).
    async fn resolve(&self, instance: &str) -> Result<Option<Uri>, BackendError> {
        if self.is_gone(instance) {
            return Err(BackendError::NotReady {
                instance: instance.to_string(),
                reason: "EC2 reports the instance terminated or stopped".into(),
            });
        }
        if let Some(base) = self.lock().get(instance).and_then(|t| t.base.clone()) {
            return Ok(Some(base));
        }
        // API errors are recorded and retried at the next poll, until the boot timeout.
        let Some(inst) = self.observe(instance).await else {
            return Ok(None);
        };
        match state_of(&inst) {
            InstanceStateName::Pending => Ok(None),
            InstanceStateName::Running => match self.address(&inst) {
                Ok(Some(base)) => {
                    if let Some(t) = self.lock().get_mut(instance) {
                        t.base = Some(base.clone());
                    }
                    Ok(Some(base))
                }
                Ok(None) => Ok(None),
                Err(reason) => Err(BackendError::NotReady {
                    instance: instance.to_string(),
                    reason,
                }),
            },
            other => Err(BackendError::NotReady {
                instance: instance.to_string(),
                reason: format!("instance is {}", other.as_str()),
            }),
        }
    }

    async fn shutdown(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let terminating: Vec<String> = {
            let map = self.lock();
            let mut v: Vec<String> = map
                .iter()
                .filter(|(_, t)| t.terminating)
                .map(|(id, _)| id.clone())
                .collect();
            v.sort();
            v
        };
        let ids = self.managed();
        match self.cfg.on_shutdown {
            Ec2ShutdownPolicy::Keep => {
                tracing::info!(
                    instances = ?ids,
                    pool = %self.cfg.pool_name,
                    "keeping EC2 instances for the next run to adopt (on_shutdown: keep)"
                );
                if !terminating.is_empty() {
                    let _ = self.terminate_ids(&terminating, SHUTDOWN_CONFIRM_FOR).await;
                }
            }
            Ec2ShutdownPolicy::Terminate => {
                let mut all = ids;
                all.extend(terminating);
                if !all.is_empty() {
                    let _ = self.terminate_ids(&all, SHUTDOWN_CONFIRM_FOR).await;
                }
            }
        }
    }
}

/// Why a TerminateInstances batch failed.
enum TerminateError {
    /// `InvalidInstanceID.NotFound` / `.Malformed`, with the ids its message names.
    NotFound(Vec<String>),
    /// Anything else, after the retries; the message for the log.
    Failed(String),
}

/// Run the pool audit every `audit_interval_seconds` until the pool is dropped or shut
/// down.
fn spawn_audit(pool: &Arc<Pool>) {
    let weak: Weak<Pool> = Arc::downgrade(pool);
    let every = pool
        .cfg
        .audit_interval_seconds
        .get()
        .max(Duration::from_millis(100));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(pool) = weak.upgrade() else { return };
            if pool.closed.load(Ordering::Relaxed) {
                return;
            }
            pool.audit().await;
        }
    });
}

impl VmProvider for Ec2VmPool {
    fn kind(&self) -> &'static str {
        PROVIDER
    }

    fn executes_scaling(&self) -> bool {
        true
    }

    /// Adopt this gateway's ready instances (see the [module docs](self)) and start the
    /// pool audit.
    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        Box::pin(async move {
            let (adopted, stale) = self.pool.adopt_instances().await;
            if !stale.is_empty() {
                tracing::warn!(instances = ?stale, "terminating this gateway's pool instances that are not ready at start (booting, unhealthy, stopped)");
                let pool = Arc::clone(&self.pool);
                tokio::spawn(async move {
                    let _ = pool.terminate_ids(&stale, TERMINATE_CONFIRM_FOR).await;
                });
            }
            spawn_audit(&self.pool);
            Ok(adopted)
        })
    }

    fn launch(&self, vm: VmId, term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(self.pool.launch_vm(vm, term))
    }

    fn launch_token(&self, vm: VmId, term: u64) -> Option<String> {
        Some(self.pool.launch_stem(vm, term))
    }

    fn recover_launch<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Recovered, BackendError>> {
        Box::pin(self.pool.recover_launch(token))
    }

    fn highest_term(&self) -> u64 {
        self.pool.highest_term.load(Ordering::Relaxed)
    }

    fn audit_now(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.pool.audit())
    }

    fn resolve<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(self.pool.resolve(instance))
    }

    fn terminate<'a>(&'a self, instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            if self.pool.is_gone(instance) && !self.pool.lock().contains_key(instance) {
                return Ok(()); // Terminated outside the gateway (a stopped one is being terminated).
            }
            self.pool
                .terminate_ids(&[instance.to_string()], TERMINATE_CONFIRM_FOR)
                .await
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.pool.shutdown())
    }

    fn take_pool_changes(&self) -> PoolChanges {
        std::mem::take(&mut *self.pool.changes.lock())
    }

    fn track(&self, instance: &str, base: &Uri) {
        self.pool.lock().insert(
            instance.to_owned(),
            Tracked {
                base: Some(base.clone()),
                ..Tracked::default()
            },
        );
    }

    fn errors(&self) -> ProviderErrorStats {
        self.pool.errors.snapshot()
    }
}

/// The pool part of a leader-term client token: FNV-1a (64 bits, folded to 32) of
/// `pool_name`, a NUL byte and the gateway id, so that two pools, or two clusters
/// sharing a pool under their own ids, never send the same token.
pub fn pool_token_id(pool_name: &str, gateway_id: &str) -> u32 {
    use std::hash::Hasher as _;
    let mut h = fnv::FnvHasher::default();
    h.write(pool_name.as_bytes());
    h.write(&[0]);
    h.write(gateway_id.as_bytes());
    let x = h.finish();
    (x ^ (x >> 32)) as u32
}

/// The client-token stem of a coordinated leader's launch: `spw-POOL-TERM-VM`, POOL
/// being [`pool_token_id`] as 8 hexadecimal digits, TERM the leader's term (decimal),
/// VM the controller's VM id (`vm-7`); each subnet attempt sends `STEM-N` (N = 0, 1, …).
/// At most 4 + 8 + 1 + 20 + 1 + 23 = 57 characters for the stem, under EC2's 64 with
/// the attempt number.
pub fn term_token_stem(pool: u32, term: u64, vm: VmId) -> String {
    format!("spw-{pool:08x}-{term}-{vm}")
}

/// Read a client token of [`term_token_stem`]'s form (with its attempt number):
/// `(pool id, term, VM id)`; `None` for any other token.
pub fn parse_term_token(token: &str) -> Option<(u32, u64, VmId)> {
    let rest = token.strip_prefix("spw-")?;
    let (pool, rest) = rest.split_once('-')?;
    let (term, rest) = rest.split_once('-')?;
    let rest = rest.strip_prefix("vm-")?;
    let (vm, attempt) = rest.split_once('-')?;
    if pool.len() != 8 || attempt.is_empty() || !attempt.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((
        u32::from_str_radix(pool, 16).ok()?,
        term.parse().ok()?,
        VmId(vm.parse().ok()?),
    ))
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

fn tag_value<'a>(inst: &'a Instance, key: &str) -> Option<&'a str> {
    inst.tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

fn state_of(inst: &Instance) -> InstanceStateName {
    inst.state()
        .and_then(|s| s.name())
        .cloned()
        .unwrap_or(InstanceStateName::Pending)
}

fn filter<'a>(name: &str, values: impl IntoIterator<Item = &'a str>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(str::to_string).collect()))
        .build()
}

/// The instance ids (`i-` and 8 or 17 hex digits) an EC2 error message names, e.g.
/// `The instance IDs 'i-0123456789abcdef0, i-1234abcd' do not exist`.
pub fn instance_ids_in(message: &str) -> Vec<String> {
    let b = message.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts =
            b[i] == b'i' && b[i + 1] == b'-' && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
        if starts {
            let hex = b[i + 2..]
                .iter()
                .take_while(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                .count();
            let end = i + 2 + hex;
            let boundary = end == b.len() || !b[end].is_ascii_alphanumeric();
            if (hex == 8 || hex == 17) && boundary {
                out.push(message[i..end].to_owned());
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// An upstream base URL read from an instance (tag value or built from its address).
///
/// # Errors
/// A message when it is not an `http://host[:port]` or `https://host[:port]` URL.
pub fn parse_upstream(url: &str) -> Result<Uri, String> {
    match url.parse::<Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some() => {
            Ok(u)
        }
        _ => Err(format!(
            "upstream URL {url:?} is not an http(s)://host:port URL"
        )),
    }
}

/// An instance's upstream URL (from its tag, or built from its address) checked like a
/// user-given upstream ([`crate::net::upstream::check_host`]):
/// link-local and metadata addresses (169.254.169.254, `fd00:ec2::254`) are refused,
/// loopback and unspecified ones unless `allow_loopback`
/// (`gateway.allow_loopback_upstreams`). An instance tag is written by whatever runs on
/// the instance, so it is not trusted more than the configuration.
///
/// # Errors
/// A message naming the URL and the rule.
pub fn instance_upstream(url: &str, allow_loopback: bool) -> Result<Uri, String> {
    let base = parse_upstream(url)?;
    let host = base.host().unwrap_or_default();
    crate::net::upstream::check_host(host, allow_loopback)
        .map_err(|e| format!("upstream URL {url:?}: {e}"))?;
    Ok(base)
}

/// Every address EC2 reports for `inst`: its primary private, public and IPv6 addresses
/// and those of each network interface (private, their public association, IPv6).
pub fn instance_ips(inst: &Instance) -> Vec<IpAddr> {
    let mut texts: Vec<&str> = [
        inst.private_ip_address(),
        inst.public_ip_address(),
        inst.ipv6_address(),
    ]
    .into_iter()
    .flatten()
    .collect();
    for ni in inst.network_interfaces() {
        texts.extend(ni.association().and_then(|a| a.public_ip()));
        for p in ni.private_ip_addresses() {
            texts.extend(p.private_ip_address());
            texts.extend(p.association().and_then(|a| a.public_ip()));
        }
        texts.extend(ni.ipv6_addresses().iter().filter_map(|a| a.ipv6_address()));
    }
    let mut ips: Vec<IpAddr> = texts.iter().filter_map(|t| t.parse().ok()).collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// With `address: tag`: the tag's URL must name one of the instance's `own` addresses
/// ([`instance_ips`]) or an IP in `allowed` (`vm_pool.tag_address_allowed_cidrs`). The
/// tag is written by whatever runs on the instance: without this, an instance could
/// point the gateway at any other host the gateway can reach.
///
/// # Errors
/// A message naming the URL, the instance's addresses and the setting.
pub fn check_tag_address(
    base: &Uri,
    own: &[IpAddr],
    allowed: &[ipnet::IpNet],
) -> Result<(), String> {
    let host = base.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let Ok(ip) = bare.parse::<IpAddr>() else {
        return Err(format!(
            "upstream URL {base}: the tag names the host `{host}`; with address: tag it must name one of the instance's own IPs or an IP in vm_pool.tag_address_allowed_cidrs"
        ));
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    if own.contains(&ip) || allowed.iter().any(|net| net.contains(&ip)) {
        return Ok(());
    }
    let own = own
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Err(format!(
        "{ip} (upstream URL {base}) is neither one of the instance's own addresses nor in vm_pool.tag_address_allowed_cidrs; its own: {own}"
    ))
}

/// Whether a failed RunInstances call may still have launched an instance: its reply
/// was lost (the connection closed or broke after the request was written), it timed
/// out after the request left, or EC2 answered with a server error (5xx) that is not a
/// definite answer (`InternalError`, `Unavailable`, an unknown code; not
/// `InsufficientInstanceCapacity` or `RequestLimitExceeded`, which EC2 also sends as
/// 5xx) after the SDK's own retries. Only a request that never left (no connection
/// could be made, [`super::aws_http::never_sent`]) or that the client refused to send
/// is a definite failure.
fn may_have_launched<E: ProvideErrorMetadata>(e: &SdkError<E>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(d) => {
            !d.is_user()
                && !d
                    .as_connector_error()
                    .is_some_and(|c| super::aws_http::never_sent(c))
        }
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            status >= 500 && classify_code(s.err().code(), status) == ErrorKind::Other
        }
        _ => false,
    }
}

/// The kind of a failed SDK call (the `kind` label).
pub fn classify<E: ProvideErrorMetadata>(e: &SdkError<E>) -> ErrorKind {
    match e {
        SdkError::TimeoutError(_) => ErrorKind::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => ErrorKind::Timeout,
        SdkError::DispatchFailure(d) if d.is_io() => ErrorKind::Unreachable,
        SdkError::DispatchFailure(_) => ErrorKind::Other,
        SdkError::ServiceError(s) => classify_code(s.err().code(), s.raw().status().as_u16()),
        _ => ErrorKind::Other,
    }
}

/// The kind of an EC2 API error reply, from its error code and HTTP status.
/// [`ErrorKind::Capacity`] means another subnet (availability zone) may succeed:
/// no capacity there, the instance type not offered in that zone (`Unsupported`), the
/// subnet out of addresses. [`ErrorKind::Quota`]: an account limit, the same everywhere.
pub fn classify_code(code: Option<&str>, status: u16) -> ErrorKind {
    match code.unwrap_or("") {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientAddressCapacity"
        | "InsufficientFreeAddressesInSubnet"
        | "Unsupported" => ErrorKind::Capacity,
        "InstanceLimitExceeded" | "VcpuLimitExceeded" | "MaxSpotInstanceCountExceeded" => {
            ErrorKind::Quota
        }
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "TooManyRequestsException" => ErrorKind::Throttling,
        "UnauthorizedOperation"
        | "AccessDenied"
        | "AccessDeniedException"
        | "AuthFailure"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "UnrecognizedClientException"
        | "OptInRequired"
        | "Blocked" => ErrorKind::AccessDenied,
        c if c.starts_with("Invalid") || c.starts_with("Missing") => ErrorKind::InvalidRequest,
        _ => match status {
            429 => ErrorKind::Throttling,
            401 | 403 => ErrorKind::AccessDenied,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Other,
        },
    }
}

/// `call` until it succeeds, for at most `total`: after a failure, `on_retry(attempt,
/// pause)` and a pause (`first`, doubling up to `max`, up to a quarter more as
/// jitter). A call still running when `total` has passed is dropped. `None`: no call
/// succeeded in time.
async fn retry_for<T, E, Fut>(
    total: Duration,
    first: Duration,
    max: Duration,
    mut call: impl FnMut() -> Fut,
    mut on_retry: impl FnMut(u32, Duration),
) -> Option<T>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + total;
    let mut pause = first;
    for attempt in 1.. {
        match tokio::time::timeout_at(deadline, call()).await {
            Ok(Ok(found)) => return Some(found),
            Ok(Err(_)) => {}
            Err(_) => return None,
        }
        let wait = pause + rand::random_range(Duration::ZERO..=pause / 4);
        if tokio::time::Instant::now() + wait >= deadline {
            return None;
        }
        on_retry(attempt, pause);
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(max);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing that keeps failing slowly (as the SDK's own retries against a closed
    /// port do) gives up when the time is up, not after a number of attempts; one
    /// that hangs is cut at the deadline; one that succeeds late still counts.
    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded_by_time_not_attempts() {
        let total = Duration::from_secs(12);
        let start = tokio::time::Instant::now();
        let mut calls = 0;
        let mut retries = Vec::new();
        let got: Option<()> = retry_for(
            total,
            Duration::from_millis(500),
            Duration::from_secs(8),
            || {
                calls += 1;
                async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Err::<(), _>("refused")
                }
            },
            |attempt, pause| retries.push((attempt, pause)),
        )
        .await;
        assert_eq!(got, None);
        assert!(start.elapsed() <= total, "{:?}", start.elapsed());
        assert_eq!(calls, 3, "3 s calls with 0.5 s and 1 s pauses fit 12 s");
        assert_eq!(
            retries,
            [(1, Duration::from_millis(500)), (2, Duration::from_secs(1))]
        );

        let start = tokio::time::Instant::now();
        let hung: Option<()> = retry_for(
            total,
            Duration::from_millis(500),
            Duration::from_secs(8),
            std::future::pending::<Result<(), ()>>,
            |_, _| {},
        )
        .await;
        assert_eq!(hung, None);
        assert_eq!(start.elapsed(), total);

        let mut n = 0;
        let late = retry_for(
            total,
            Duration::from_millis(500),
            Duration::from_secs(8),
            || {
                n += 1;
                let ok = n == 4;
                async move { if ok { Ok(n) } else { Err(()) } }
            },
            |_, _| {},
        )
        .await;
        assert_eq!(late, Some(4));
    }

    #[test]
    fn error_codes_map_to_fixed_kinds() {
        assert_eq!(
            classify_code(Some("InsufficientInstanceCapacity"), 500),
            ErrorKind::Capacity
        );
        assert_eq!(classify_code(Some("Unsupported"), 400), ErrorKind::Capacity);
        assert_eq!(
            classify_code(Some("InsufficientFreeAddressesInSubnet"), 400),
            ErrorKind::Capacity
        );
        assert_eq!(
            classify_code(Some("VcpuLimitExceeded"), 400),
            ErrorKind::Quota
        );
        assert_eq!(
            classify_code(Some("InstanceLimitExceeded"), 400),
            ErrorKind::Quota
        );
        assert_eq!(
            classify_code(Some("RequestLimitExceeded"), 503),
            ErrorKind::Throttling
        );
        assert_eq!(
            classify_code(Some("UnauthorizedOperation"), 403),
            ErrorKind::AccessDenied
        );
        assert_eq!(
            classify_code(Some("InvalidAMIID.NotFound"), 400),
            ErrorKind::InvalidRequest
        );
        assert_eq!(classify_code(None, 429), ErrorKind::Throttling);
        assert_eq!(classify_code(None, 403), ErrorKind::AccessDenied);
        assert_eq!(classify_code(Some("InternalError"), 500), ErrorKind::Other);
    }

    #[test]
    fn instance_ids_are_read_from_error_messages() {
        assert_eq!(
            instance_ids_in("The instance ID 'i-1234567890abcdef0' does not exist"),
            ["i-1234567890abcdef0"]
        );
        assert_eq!(
            instance_ids_in("The instance IDs 'i-1234abcd, i-0123456789abcdef0' do not exist"),
            ["i-1234abcd", "i-0123456789abcdef0"]
        );
        // Not ids: wrong length, upper case, part of a word.
        assert!(instance_ids_in("i-123 xi-1234abcd i-1234ABCD i-1234abcde").is_empty());
        assert!(instance_ids_in("").is_empty());
    }

    #[test]
    fn upstream_urls_must_be_plain_http_with_a_host() {
        assert_eq!(
            parse_upstream("http://127.0.0.1:8080").unwrap().to_string(),
            "http://127.0.0.1:8080/"
        );
        assert!(parse_upstream("https://x:1").is_ok());
        assert!(parse_upstream("ftp://x:1").is_err());
        assert!(parse_upstream("127.0.0.1:80").is_err());
        assert!(parse_upstream("not a url").is_err());
    }

    /// The address an instance tag gives is checked like a user-given
    /// upstream.
    #[test]
    fn instance_addresses_follow_the_upstream_policy() {
        for url in [
            "http://169.254.169.254",
            "http://169.254.169.254:80/latest",
            "http://169.254.10.1:8080",
            "http://[fd00:ec2::254]:80",
            "http://[fe80::1]:8080",
            "http://[::ffff:169.254.169.254]:80",
        ] {
            for allow_loopback in [false, true] {
                let e = instance_upstream(url, allow_loopback).unwrap_err();
                assert!(
                    e.contains("link-local") || e.contains("metadata"),
                    "{url}: {e}"
                );
            }
        }
        for url in [
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
            "http://localhost:8080",
            "http://0.0.0.0:8080",
        ] {
            let e = instance_upstream(url, false).unwrap_err();
            assert!(e.contains("allow_loopback_upstreams"), "{url}: {e}");
            assert!(
                instance_upstream(url, true).is_ok(),
                "{url} with the opt-in"
            );
        }
        for url in ["http://10.0.3.7:8080", "http://ip-10-0-3-7.ec2.internal:80"] {
            assert_eq!(
                instance_upstream(url, false).unwrap(),
                parse_upstream(url).unwrap()
            );
        }
        assert!(instance_upstream("ftp://10.0.3.7", true).is_err());
        // `scheme: https` instances are reached over TLS (gateway.upstream_tls).
        let tls = instance_upstream("https://10.0.3.7", false).unwrap();
        assert_eq!(tls.scheme_str(), Some("https"));
    }

    /// With `address: tag`, the tag may name only the instance's own addresses, or an
    /// IP of `vm_pool.tag_address_allowed_cidrs`; host names are refused.
    #[test]
    fn a_tag_address_must_be_the_instances_own_ip_or_allow_listed() {
        use aws_sdk_ec2::types::{
            InstanceIpv6Address, InstanceNetworkInterface, InstancePrivateIpAddress,
        };
        let inst = Instance::builder()
            .private_ip_address("10.0.3.7")
            .public_ip_address("203.0.113.9")
            .network_interfaces(
                InstanceNetworkInterface::builder()
                    .private_ip_addresses(
                        InstancePrivateIpAddress::builder()
                            .private_ip_address("10.0.4.8")
                            .build(),
                    )
                    .ipv6_addresses(
                        InstanceIpv6Address::builder()
                            .ipv6_address("2001:db8::7")
                            .build(),
                    )
                    .build(),
            )
            .build();
        let own = instance_ips(&inst);
        assert_eq!(own.len(), 4, "{own:?}");
        let allowed: Vec<ipnet::IpNet> = vec!["192.0.2.0/24".parse().unwrap()];
        let check = |url: &str, allowed: &[ipnet::IpNet]| {
            check_tag_address(&parse_upstream(url).unwrap(), &own, allowed)
        };
        for url in [
            "http://10.0.3.7:8080",
            "https://203.0.113.9",
            "http://10.0.4.8:1",
            "http://[2001:db8::7]:8080",
        ] {
            assert_eq!(check(url, &[]), Ok(()), "{url}");
        }
        let e = check("http://10.0.3.8:8080", &[]).unwrap_err();
        assert!(
            e.contains("10.0.3.8 (upstream URL http://10.0.3.8:8080/) is neither one of the instance's own addresses")
                && e.contains("10.0.3.7")
                && e.contains("tag_address_allowed_cidrs"),
            "{e}"
        );
        assert!(check("http://192.0.2.77:8080", &[]).is_err());
        assert_eq!(check("http://192.0.2.77:8080", &allowed), Ok(()));
        let e = check("http://api.example.com:8080", &allowed).unwrap_err();
        assert!(e.contains("names the host `api.example.com`"), "{e}");
    }

    /// A coordinated leader's client token names the pool (and gateway id), the term
    /// and the VM, fits EC2's 64 characters at the extremes, and reads back.
    #[test]
    fn leader_term_tokens_carry_the_pool_term_and_vm() {
        let pool = pool_token_id("api-pool", "cluster-a");
        assert_ne!(pool, pool_token_id("api-pool", "cluster-b"));
        assert_ne!(pool, pool_token_id("api-poo", "lcluster-a"));
        let stem = term_token_stem(pool, 17, VmId(3));
        assert_eq!(stem, format!("spw-{pool:08x}-17-vm-3"));
        assert_eq!(
            parse_term_token(&format!("{stem}-1")),
            Some((pool, 17, VmId(3)))
        );
        let longest = format!(
            "{}-999",
            term_token_stem(u32::MAX, u64::MAX, VmId(u64::MAX))
        );
        assert!(longest.len() <= 64, "{} characters", longest.len());
        assert_eq!(
            parse_term_token(&longest),
            Some((u32::MAX, u64::MAX, VmId(u64::MAX)))
        );
        for other in [
            "spillway-0123456789abcdef-vm-3-0",
            &stem,
            "spw-123-17-vm-3-0",
            "spw-0000000g-17-vm-3-0",
            "",
        ] {
            assert_eq!(parse_term_token(other), None, "{other}");
        }
    }

    /// The pool's writer id never comes from the host: without `gateway_id` it is the
    /// `pool_name` (the config sets the cluster name under coordination).
    #[test]
    fn the_gateway_id_is_derived_from_the_pool_name_not_the_host() {
        let mut cfg: Ec2VmPoolConfig = serde_json::from_value(serde_json::json!({
            "pool_name": "api-pool",
            "image_id": "ami-12c6146b",
            "instance_type": "t3.micro",
        }))
        .unwrap();
        assert_eq!(effective_gateway_id(&cfg), "api-pool");
        cfg.gateway_id = Some("gw-eu".into());
        assert_eq!(effective_gateway_id(&cfg), "gw-eu");
    }
}
