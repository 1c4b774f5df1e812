//! `vm_pool: {type: ec2}`: VMs are EC2 instances launched and terminated through the EC2
//! API with `aws-sdk-ec2` (issue 4, "EC2 VM pool provider"). Built with the `aws` cargo
//! feature only.
//!
//! * **Credentials** come only from `aws-config`'s default chain; the region and an
//!   optional endpoint URL come from the config ([`Ec2VmPoolConfig`]).
//! * **Launch**: one RunInstances call per VM (MinCount = MaxCount = 1) from the launch
//!   template or image + instance type, with a client token (idempotent SDK retries) and
//!   the tags `spillway:pool=<pool_name>`, `spillway:vm=<vm id>` plus the configured extra
//!   tags on the instance, its volumes and network interfaces. Subnets are used
//!   round-robin; a capacity error moves the same launch on to the next subnet. When a
//!   RunInstances call timed out or its reply was lost (a *partial launch*: the instance
//!   may exist), the instances carrying its client token are looked up and terminated.
//! * **Address resolution** ([`VmProvider::resolve`], polled by the driver every
//!   `probe_interval_seconds`): DescribeInstances until the instance is `running` and has
//!   its address — the private or public IPv4 plus `upstream_port`, or the URL in the
//!   `upstream_tag_key` tag (`address: tag`). The tag is the resolution seam for port
//!   mappings and for dry runs against an emulator whose instance addresses are fake: the
//!   instance's boot script (or a test standing in for it) writes its reachable URL with
//!   CreateTags, and the gateway never connects anywhere else. The resolved URL is cached.
//!   The driver then probes `health_path` until 2xx; an instance not ready within
//!   `boot_timeout_seconds` is terminated by the driver.
//! * **Scale-in**: the driver drains a VM (no new requests, in-flight ones finish), then
//!   calls [`VmProvider::terminate`] → TerminateInstances (retried with backoff on
//!   throttling and unreachable-API errors).
//! * **Adoption** on start: instances with the pool tag in state `pending` or `running`
//!   are listed; those that are `running`, resolve, and pass one health probe are adopted
//!   as ready VMs (a restart does not double the pool). The others — still booting, or
//!   failing the probe — are terminated: no other gateway manages them, and the
//!   controller launches replacements at its next decision if it needs them.
//! * **Shutdown**: `on_shutdown: keep` (default) leaves the instances for the next run to
//!   adopt; `terminate` terminates every instance this run launched or adopted.
//! * **Failures** (capacity, throttling, access denied, unreachable endpoint, timeouts)
//!   never crash the gateway: each is logged, counted in
//!   `spillway_provider_errors_total{provider="ec2"}` and shown in `/status`
//!   (`vm_pool.errors`, via [`ProviderErrors`]). A failed launch is reported to the
//!   controller, which serves with the VMs that are ready and spills the rest to the
//!   function tier; a failed adoption listing starts the gateway with no adopted VM.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, IamInstanceProfileSpecification, Instance, InstanceStateName, InstanceType,
    LaunchTemplateSpecification, ResourceType, Tag, TagSpecification,
};
use base64::Engine as _;
use http::Uri;

use super::provider_errors::{ErrorKind, ProviderErrorStats, ProviderErrors};
use super::{BackendError, BoxFuture, VmProvider};
use crate::config::{EC2_POOL_TAG_KEY, Ec2Address, Ec2ShutdownPolicy, Ec2VmPoolConfig};
use crate::net::client::UpstreamClient;
use crate::policy::VmId;

/// Tag carrying the controller's VM id (`vm-3`) on instances this gateway launched.
pub const EC2_VM_TAG_KEY: &str = "spillway:vm";
/// TerminateInstances attempts (each with the SDK's own retries) before giving up.
pub const TERMINATE_ATTEMPTS: u32 = 5;
/// First back-off between TerminateInstances attempts; doubles each time.
pub const TERMINATE_BACKOFF: Duration = Duration::from_millis(500);
/// Connect timeout towards the EC2 endpoint.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Timeout of one EC2 API call attempt.
pub const API_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of one EC2 API call, retries included.
pub const API_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per EC2 API call, the SDK's standard retry mode (throttling, 5xx, I/O).
pub const API_MAX_ATTEMPTS: u32 = 3;

const PROVIDER: &str = "ec2";
const OP_RUN: &str = "run_instances";
const OP_DESCRIBE: &str = "describe_instances";
const OP_TERMINATE: &str = "terminate_instances";
const NOT_FOUND: &str = "InvalidInstanceID.NotFound";

/// What the provider knows about one of its instances.
#[derive(Clone, Debug, Default)]
struct Tracked {
    /// Resolved upstream URL, cached once known.
    base: Option<Uri>,
}

/// An EC2 VM pool. See the [module docs](self).
#[derive(Debug)]
pub struct Ec2VmPool {
    client: Client,
    cfg: Ec2VmPoolConfig,
    http: UpstreamClient,
    run_id: u64,
    next_subnet: AtomicUsize,
    instances: Mutex<HashMap<String, Tracked>>,
    errors: ProviderErrors,
}

impl Ec2VmPool {
    /// Load the AWS SDK configuration (default credential chain; region and endpoint from
    /// `cfg`) and build the pool. `http` is the gateway's upstream client, used for the
    /// health probe of instances found at start. No API call is made here.
    ///
    /// # Errors
    /// [`BackendError::Provider`] when no region is configured anywhere
    /// (`vm_pool.region`, `AWS_REGION`, the profile).
    pub async fn new(cfg: &Ec2VmPoolConfig, http: UpstreamClient) -> Result<Self, BackendError> {
        let sdk = super::aws_sdk::load(
            "ec2",
            "vm_pool",
            cfg.region.as_deref(),
            cfg.endpoint_url.as_deref(),
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(API_CONNECT_TIMEOUT)
                .operation_attempt_timeout(API_ATTEMPT_TIMEOUT)
                .operation_timeout(API_OPERATION_TIMEOUT)
                .build(),
            aws_config::retry::RetryConfig::standard().with_max_attempts(API_MAX_ATTEMPTS),
        )
        .await?;
        Ok(Self {
            client: Client::new(&sdk),
            cfg: cfg.clone(),
            http,
            run_id: rand::random(),
            next_subnet: AtomicUsize::new(0),
            instances: Mutex::new(HashMap::new()),
            errors: ProviderErrors::new(PROVIDER),
        })
    }

    /// Instances currently managed (launched or adopted, not terminated).
    pub fn managed(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.instances.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tag_specifications(&self, vm: VmId) -> Vec<TagSpecification> {
        let mut tags = vec![
            tag(EC2_POOL_TAG_KEY, &self.cfg.pool_name),
            tag(EC2_VM_TAG_KEY, &vm.to_string()),
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

    /// One RunInstances call for `vm` into `subnet`.
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

    async fn launch_vm(&self, vm: VmId) -> Result<String, BackendError> {
        let subnets = &self.cfg.subnet_ids;
        let attempts = subnets.len().max(1);
        let first = self.next_subnet.fetch_add(1, Ordering::Relaxed);
        let mut last_error = String::new();
        for i in 0..attempts {
            let subnet =
                (!subnets.is_empty()).then(|| subnets[(first + i) % subnets.len()].as_str());
            // A client token is bound to its parameters: one per subnet attempt.
            let token = format!("spillway-{:016x}-{vm}-{i}", self.run_id);
            match self.run_one(vm, subnet, &token).await {
                Ok(id) if !id.is_empty() => {
                    self.lock().insert(id.clone(), Tracked::default());
                    tracing::info!(%vm, instance = %id, subnet = subnet.unwrap_or("-"), pool = %self.cfg.pool_name, "EC2 instance launched");
                    return Ok(id);
                }
                Ok(_) => {
                    self.errors.record(
                        OP_RUN,
                        ErrorKind::Other,
                        "RunInstances returned no instance",
                    );
                    return Err(BackendError::Provider(
                        "ec2: RunInstances returned no instance".into(),
                    ));
                }
                Err(e) => {
                    let kind = classify(&e);
                    let msg = DisplayErrorContext(&e).to_string();
                    self.errors.record(OP_RUN, kind, &msg);
                    if may_have_launched(&e) {
                        self.clean_up_token(&token).await;
                    }
                    last_error = format!("ec2: RunInstances failed ({}): {msg}", kind.as_str());
                    if kind == ErrorKind::Capacity && i + 1 < attempts {
                        tracing::info!(%vm, "no capacity in subnet {}; trying the next one", subnet.unwrap_or("-"));
                        continue;
                    }
                    break;
                }
            }
        }
        Err(BackendError::Provider(last_error))
    }

    /// After an ambiguous RunInstances failure, terminate whatever the token launched.
    async fn clean_up_token(&self, token: &str) {
        let found = self
            .client
            .describe_instances()
            .filters(filter("client-token", [token]))
            .send()
            .await;
        match found {
            Ok(out) => {
                let ids = instance_ids(out.reservations().iter().flat_map(|r| r.instances()));
                if !ids.is_empty() {
                    tracing::warn!(
                        ?ids,
                        token,
                        "partial launch: terminating instances of a failed RunInstances call"
                    );
                    let _ = self.terminate_ids(&ids).await;
                }
            }
            Err(e) => {
                self.errors
                    .record(OP_DESCRIBE, classify(&e), DisplayErrorContext(&e));
                tracing::warn!(
                    token,
                    "a failed RunInstances call may have left an instance; it carries the pool tag and is adopted or terminated at the next start"
                );
            }
        }
    }

    /// DescribeInstances for one id: `Ok(None)` when not (yet) visible.
    async fn describe_one(&self, id: &str) -> Result<Option<Instance>, ()> {
        match self
            .client
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find(|i| i.instance_id() == Some(id))
                .cloned()),
            Err(e) if e.code() == Some(NOT_FOUND) => Ok(None),
            Err(e) => {
                self.errors
                    .record(OP_DESCRIBE, classify(&e), DisplayErrorContext(&e));
                Err(())
            }
        }
    }

    /// Pending and running instances of the pool (every page).
    async fn list_pool(&self) -> Result<Vec<Instance>, ()> {
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
                .filters(filter("instance-state-name", ["pending", "running"]))
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

    /// The upstream URL of `inst` per `vm_pool.address`; `Ok(None)` while unknown.
    fn address(&self, inst: &Instance) -> Result<Option<Uri>, String> {
        let c = &self.cfg;
        let url = match c.address {
            Ec2Address::PrivateIp => inst
                .private_ip_address()
                .map(|ip| format!("{}://{ip}:{}", c.scheme, c.upstream_port)),
            Ec2Address::PublicIp => inst
                .public_ip_address()
                .map(|ip| format!("{}://{ip}:{}", c.scheme, c.upstream_port)),
            Ec2Address::Tag => inst
                .tags()
                .iter()
                .find(|t| t.key() == Some(c.upstream_tag_key.as_str()))
                .and_then(|t| t.value())
                .map(str::to_string),
        };
        url.map(|u| parse_upstream(&u)).transpose()
    }

    /// TerminateInstances for `ids`, retried with back-off on transient errors.
    async fn terminate_ids(&self, ids: &[String]) -> Result<(), BackendError> {
        let mut backoff = TERMINATE_BACKOFF;
        for attempt in 1..=TERMINATE_ATTEMPTS {
            let res = self
                .client
                .terminate_instances()
                .set_instance_ids(Some(ids.to_vec()))
                .send()
                .await;
            match res {
                Ok(_) => {
                    let mut map = self.lock();
                    for id in ids {
                        map.remove(id);
                    }
                    tracing::info!(instances = ?ids, "EC2 instances terminated");
                    return Ok(());
                }
                Err(e) if e.code() == Some(NOT_FOUND) && ids.len() == 1 => {
                    self.lock().remove(&ids[0]);
                    return Ok(());
                }
                Err(e) => {
                    let kind = classify(&e);
                    let msg = DisplayErrorContext(&e).to_string();
                    self.errors.record(OP_TERMINATE, kind, &msg);
                    if !kind.is_transient() || attempt == TERMINATE_ATTEMPTS {
                        tracing::error!(instances = ?ids, "EC2 instances may still be running; they carry the pool tag and are adopted or terminated at the next start");
                        return Err(BackendError::Provider(format!(
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

    async fn adopt_instances(&self) -> Vec<(String, Uri)> {
        let Ok(found) = self.list_pool().await else {
            tracing::warn!(pool = %self.cfg.pool_name, "cannot list the pool's instances; starting without adopted VMs");
            return Vec::new();
        };
        let mut checks = tokio::task::JoinSet::new();
        for inst in found {
            let Some(id) = inst.instance_id().map(str::to_string) else {
                continue;
            };
            let running = inst.state().and_then(|s| s.name()) == Some(&InstanceStateName::Running);
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
                (id, base.filter(|_| ready))
            });
        }
        let mut adopted = Vec::new();
        let mut stale = Vec::new();
        while let Some(joined) = checks.join_next().await {
            match joined {
                Ok((id, Some(base))) => adopted.push((id, base)),
                Ok((id, None)) => stale.push(id),
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
                    },
                );
            }
        }
        tracing::info!(pool = %self.cfg.pool_name, adopted = adopted.len(), not_ready = stale.len(), "EC2 adoption");
        if !stale.is_empty() {
            stale.sort();
            tracing::warn!(instances = ?stale, "terminating pool instances that are not ready at start");
            let _ = self.terminate_ids(&stale).await;
        }
        adopted
    }
}

impl VmProvider for Ec2VmPool {
    fn kind(&self) -> &'static str {
        PROVIDER
    }

    fn executes_scaling(&self) -> bool {
        true
    }

    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        Box::pin(async move { Ok(self.adopt_instances().await) })
    }

    fn launch(&self, vm: VmId) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(self.launch_vm(vm))
    }

    fn resolve<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(async move {
            if let Some(base) = self.lock().get(instance).and_then(|t| t.base.clone()) {
                return Ok(Some(base));
            }
            // API errors are recorded and retried at the next poll, until the boot timeout.
            let Ok(Some(inst)) = self.describe_one(instance).await else {
                return Ok(None);
            };
            let state = inst
                .state()
                .and_then(|s| s.name())
                .cloned()
                .unwrap_or(InstanceStateName::Pending);
            match state {
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
        })
    }

    fn terminate<'a>(&'a self, instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move { self.terminate_ids(&[instance.to_string()]).await })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ids = self.managed();
            match self.cfg.on_shutdown {
                Ec2ShutdownPolicy::Keep => tracing::info!(
                    instances = ?ids,
                    pool = %self.cfg.pool_name,
                    "keeping EC2 instances for the next run to adopt (on_shutdown: keep)"
                ),
                Ec2ShutdownPolicy::Terminate if ids.is_empty() => {}
                Ec2ShutdownPolicy::Terminate => {
                    let _ = self.terminate_ids(&ids).await;
                }
            }
        })
    }

    fn errors(&self) -> ProviderErrorStats {
        self.errors.snapshot()
    }
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

fn filter<'a>(name: &str, values: impl IntoIterator<Item = &'a str>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(str::to_string).collect()))
        .build()
}

fn instance_ids<'a>(instances: impl Iterator<Item = &'a Instance>) -> Vec<String> {
    instances
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect()
}

/// An upstream base URL read from an instance (tag value or built from its address).
///
/// # Errors
/// A message when it is not an `http://host[:port]` URL.
pub fn parse_upstream(url: &str) -> Result<Uri, String> {
    match url.parse::<Uri>() {
        Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => Ok(u),
        _ => Err(format!(
            "upstream URL {url:?} is not an http://host:port URL"
        )),
    }
}

/// Whether a failed RunInstances call may still have launched an instance: its reply
/// was lost or it timed out after the request left.
fn may_have_launched<E>(e: &SdkError<E>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(d) => d.is_timeout(),
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
pub fn classify_code(code: Option<&str>, status: u16) -> ErrorKind {
    match code.unwrap_or("") {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientAddressCapacity"
        | "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded" => ErrorKind::Capacity,
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
        c if c.starts_with("Invalid") || c.starts_with("Missing") || c == "Unsupported" => {
            ErrorKind::InvalidRequest
        }
        _ => match status {
            429 => ErrorKind::Throttling,
            401 | 403 => ErrorKind::AccessDenied,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_map_to_fixed_kinds() {
        assert_eq!(
            classify_code(Some("InsufficientInstanceCapacity"), 500),
            ErrorKind::Capacity
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
    fn upstream_urls_must_be_plain_http_with_a_host() {
        assert_eq!(
            parse_upstream("http://127.0.0.1:8080").unwrap().to_string(),
            "http://127.0.0.1:8080/"
        );
        assert!(parse_upstream("https://x:1").is_err());
        assert!(parse_upstream("127.0.0.1:80").is_err());
        assert!(parse_upstream("not a url").is_err());
    }
}
