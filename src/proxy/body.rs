//! The body type used between the client side and every upstream: a boxed, streaming
//! `http_body::Body` of `Bytes` chunks.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};

/// Error type of boxed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body (request or response), boxed so that hyper's `Incoming`, buffered
/// bytes and wrapped bodies share one type.
pub type Body = BoxBody<Bytes, BoxError>;

/// Box any body into a [`Body`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    boxed(Empty::<Bytes>::new().map_err(|never| match never {}))
}

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    boxed(Full::new(bytes.into()).map_err(|never| match never {}))
}

/// A body that runs a callback exactly once, when the stream ends, fails, or is dropped
/// unfinished. Used to keep a VM's request outstanding, or a function instance busy,
/// until the response has been fully streamed to the client.
pub struct OnEnd {
    inner: Body,
    on_end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl OnEnd {
    /// Wrap `inner`; `on_end` runs once.
    pub fn new(inner: Body, on_end: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self {
            inner,
            on_end: Some(Box::new(on_end)),
        }
    }

    fn fire(&mut self) {
        if let Some(f) = self.on_end.take() {
            f();
        }
    }
}

impl Drop for OnEnd {
    fn drop(&mut self) {
        self.fire();
    }
}

impl http_body::Body for OnEnd {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(
            polled,
            std::task::Poll::Ready(None) | std::task::Poll::Ready(Some(Err(_)))
        ) {
            self.fire();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn on_end_fires_once_at_end_of_stream_or_drop() {
        let n = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&n);
        let body = OnEnd::new(full("abc"), move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abc");
        assert_eq!(n.load(Ordering::SeqCst), 1);
        let c = Arc::clone(&n);
        drop(OnEnd::new(full("x"), move || {
            c.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }
}
