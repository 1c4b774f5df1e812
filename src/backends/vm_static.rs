//! `vm_pool: {type: static}`: a fixed list of upstream URLs. Every URL is adopted as a
//! ready VM named by its URL; the controller's scaling decisions are computed and reported
//! but never executed, so launch and terminate refuse.

use http::Uri;

use super::{BackendError, BoxFuture, VmProvider};
use crate::config::StaticVmPoolConfig;
use crate::policy::VmId;

/// The message of the error returned by [`StaticVmPool`]'s launch and terminate.
pub const NOT_EXECUTED: &str = "static pool: scaling is reported, not executed";

/// A VM pool of fixed upstream URLs. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct StaticVmPool {
    vms: Vec<(String, Uri)>,
}

impl StaticVmPool {
    /// A pool of the configured `urls` (parsed and checked where the config was read),
    /// in order.
    pub fn new(cfg: &StaticVmPoolConfig) -> Self {
        let vms = cfg
            .urls
            .iter()
            .map(|url| (url.as_str().to_owned(), url.uri().clone()))
            .collect();
        Self { vms }
    }
}

impl StaticVmPool {
    /// The members: (name, base URL), in configuration order.
    pub fn members(&self) -> Vec<(String, Uri)> {
        self.vms.clone()
    }
}

impl VmProvider for StaticVmPool {
    fn kind(&self) -> &'static str {
        "static"
    }

    fn executes_scaling(&self) -> bool {
        false
    }

    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        Box::pin(async move { Ok(self.vms.clone()) })
    }

    fn launch(&self, _vm: VmId, _term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(async { Err(BackendError::Provider(NOT_EXECUTED.to_string())) })
    }

    fn resolve<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(async move {
            self.vms
                .iter()
                .find(|(name, _)| name == instance)
                .map(|(_, uri)| Some(uri.clone()))
                .ok_or_else(|| BackendError::UnknownInstance(instance.to_string()))
        })
    }

    fn terminate<'a>(&'a self, _instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { Err(BackendError::Provider(NOT_EXECUTED.to_string())) })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> StaticVmPool {
        StaticVmPool::new(&StaticVmPoolConfig {
            urls: urls.iter().map(|u| u.parse().unwrap()).collect(),
            slots_per_vm: None,
        })
    }

    #[tokio::test]
    async fn adopts_every_url_and_refuses_scaling() {
        let p = pool(&["http://127.0.0.1:4001", "http://10.0.0.2:80/api"]);
        assert_eq!(p.kind(), "static");
        assert!(!p.executes_scaling());
        let adopted = p.adopt().await.unwrap();
        assert_eq!(adopted.len(), 2);
        assert_eq!(adopted[0].0, "http://127.0.0.1:4001");
        assert_eq!(adopted[1].1.path(), "/api");
        assert_eq!(
            p.resolve("http://10.0.0.2:80/api").await.unwrap(),
            Some(adopted[1].1.clone())
        );
        assert!(matches!(
            p.resolve("nope").await,
            Err(BackendError::UnknownInstance(_))
        ));
        let err = p.launch(VmId(7), None).await.unwrap_err();
        assert_eq!(err.to_string(), NOT_EXECUTED);
        assert!(matches!(
            p.terminate("http://127.0.0.1:4001").await,
            Err(BackendError::Provider(_))
        ));
        p.shutdown().await;
    }

    #[test]
    fn keeps_every_url_in_order() {
        assert_eq!(pool(&["https://example.com"]).vms.len(), 1);
        assert!(pool(&[]).vms.is_empty());
    }
}
