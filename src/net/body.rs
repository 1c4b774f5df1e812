//! The body type used between the client side and every upstream: a boxed, streaming
//! `http_body::Body` of `Bytes` chunks.

use bytes::Bytes;
use http_body::Body as _;
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

/// Whether `e` or one of its sources is the gateway's body length limit
/// (`http_body_util::Limited`), which the request path answers with 413.
pub fn is_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |err| err.source())
        .any(|err| err.is::<http_body_util::LengthLimitError>())
}

/// A response body that holds a lease `G` (an instance, a concurrency permit) and drops
/// it as soon as the inner body ends (last frame or error) or is dropped, whichever comes
/// first. The lease's `Drop` does the release.
pub struct GuardedBody<G> {
    inner: Body,
    guard: Option<G>,
}

impl<G> GuardedBody<G> {
    /// Wrap `inner`, holding `guard` until it ends.
    pub fn new(inner: Body, guard: G) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }
}

impl<G> std::fmt::Debug for GuardedBody<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedBody")
            .field("held", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<G: Unpin> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None | Some(Err(_))) => this.guard = None,
            std::task::Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.guard = None,
            _ => {}
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

/// A request body read with an idle timeout: when the client sends no byte for `idle`
/// while the upstream side waits for more, the body fails with [`RequestBodyIdle`]
/// (`gateway.request_body_idle_timeout_seconds`; the gateway answers 408). A steady slow
/// upload never trips it, however long it takes.
pub fn request_idle_timeout(idle: std::time::Duration, body: Body) -> Body {
    boxed(IdleTimeout::new(idle, body, move || {
        Box::new(RequestBodyIdle(idle)) as BoxError
    }))
}

/// A response body read with an idle timeout: an upstream that stops sending for `idle`
/// while the client waits for more fails the body with [`ResponseBodyIdle`], which
/// aborts the client's response and frees whatever the body's guard holds
/// (`gateway.response_body_idle_timeout_seconds`). `on_timeout` runs
/// once when it fires (metrics, log).
pub fn response_idle_timeout<B>(
    idle: std::time::Duration,
    body: B,
    on_timeout: impl Fn() + Send + Sync + 'static,
) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    boxed(IdleTimeout::new(idle, boxed(body), move || {
        on_timeout();
        Box::new(ResponseBodyIdle(idle)) as BoxError
    }))
}

/// A body that fails with `expired()` when its inner body yields no frame for `idle`
/// while it is being read (the timer runs only while the reader waits, so a slow
/// reader never trips it). Like tower-http's `TimeoutBody`, but it keeps the inner
/// body's `is_end_stream` and `size_hint`, which hyper and the access log rely on.
struct IdleTimeout {
    inner: Body,
    idle: std::time::Duration,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    expired: Box<dyn Fn() -> BoxError + Send + Sync>,
}

impl IdleTimeout {
    fn new(
        idle: std::time::Duration,
        inner: Body,
        expired: impl Fn() -> BoxError + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner,
            idle,
            sleep: None,
            expired: Box::new(expired),
        }
    }
}

impl http_body::Body for IdleTimeout {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::future::Future as _;
        let this = self.get_mut();
        if let std::task::Poll::Ready(frame) = std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            this.sleep = None;
            return std::task::Poll::Ready(frame);
        }
        let idle = this.idle;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => {
                this.sleep = None;
                std::task::Poll::Ready(Some(Err((this.expired)())))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The client sent no request body byte for this long (see [`request_idle_timeout`]).
#[derive(Debug, thiserror::Error)]
#[error("request body idle for {0:?}")]
pub struct RequestBodyIdle(pub std::time::Duration);

/// The upstream sent no response body byte for this long (see [`response_idle_timeout`]).
#[derive(Debug, thiserror::Error)]
#[error("response body idle for {0:?}")]
pub struct ResponseBodyIdle(pub std::time::Duration);

/// Whether `e` or one of its sources is [`RequestBodyIdle`].
pub fn is_request_idle(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |err| err.source()).any(|err| err.is::<RequestBodyIdle>())
}

/// A body that reports, through a oneshot channel, when it has been read to its end (or
/// failed, or was dropped): the moment the request was sent, from which
/// `gateway.upstream_timeout_seconds` counts the wait for the response head.
pub struct EndSignal {
    inner: Body,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl EndSignal {
    /// Wrap `inner`; the receiver resolves when it ends (at once for an empty body).
    pub fn new(inner: Body) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut me = Self {
            inner,
            done: Some(tx),
        };
        if me.inner.is_end_stream() {
            me.fire();
        }
        (me, rx)
    }

    fn fire(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

impl http_body::Body for EndSignal {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None | Some(Err(_))) => this.fire(),
            std::task::Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.fire(),
            _ => {}
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

/// A guard that runs a closure once when dropped; pairs with [`GuardedBody`] for ad-hoc
/// releases (e.g. a VM's outstanding-request count).
pub struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnDrop<F> {
    /// Run `f` when this guard is dropped.
    pub fn new(f: F) -> Self {
        Self(Some(f))
    }
}

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn guarded_body_releases_at_end_of_stream_or_drop() {
        let released = Arc::new(AtomicBool::new(false));
        let mut body = GuardedBody::new(crate::net::body::full("hello"), Flag(released.clone()));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert!(
            released.load(Ordering::SeqCst),
            "released at the last frame, before drop"
        );
        assert!(body.frame().await.is_none());

        let released = Arc::new(AtomicBool::new(false));
        let body = GuardedBody::new(crate::net::body::full("hello"), Flag(released.clone()));
        assert!(!released.load(Ordering::SeqCst));
        drop(body);
        assert!(released.load(Ordering::SeqCst));
    }
}
