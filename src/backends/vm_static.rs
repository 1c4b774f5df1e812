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
    /// A pool of the configured `urls`, in order.
    ///
    /// # Errors
    /// [`BackendError::Provider`] naming the first URL that is not `http(s)://host[:port][/path]`.
    pub fn new(cfg: &StaticVmPoolConfig) -> Result<Self, BackendError> {
        let vms = cfg
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let uri: Uri = url.parse().map_err(|e| {
                    BackendError::Provider(format!("vm_pool.urls[{i}]: not a URL ({e}): {url:?}"))
                })?;
                if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none()
                {
                    return Err(BackendError::Provider(format!(
                        "vm_pool.urls[{i}]: must be an http:// or https:// URL with a host, got {url:?}"
                    )));
                }
                Ok((url.clone(), uri))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { vms })
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

    fn launch(&self, _vm: VmId) -> BoxFuture<'_, Result<String, BackendError>> {
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

    fn pool(urls: &[&str]) -> Result<StaticVmPool, BackendError> {
        StaticVmPool::new(&StaticVmPoolConfig {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            slots_per_vm: None,
        })
    }

    #[tokio::test]
    async fn adopts_every_url_and_refuses_scaling() {
        let p = pool(&["http://127.0.0.1:4001", "http://10.0.0.2:80/api"]).unwrap();
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
        let err = p.launch(VmId(7)).await.unwrap_err();
        assert_eq!(err.to_string(), NOT_EXECUTED);
        assert!(matches!(
            p.terminate("http://127.0.0.1:4001").await,
            Err(BackendError::Provider(_))
        ));
        p.shutdown().await;
    }

    #[test]
    fn rejects_bad_urls() {
        assert!(pool(&["127.0.0.1:4001"]).is_err());
        assert!(pool(&["ftp://example.com"]).is_err());
        assert_eq!(pool(&["https://example.com"]).unwrap().vms.len(), 1);
        assert!(pool(&["http://"]).is_err());
        assert!(pool(&[]).unwrap().vms.is_empty());
    }
}
