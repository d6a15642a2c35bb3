//! Fairness between responses sharing one HTTP/2 connection.
//!
//! kube-apiserver's aggregator multiplexes many clients' requests to an extension server over
//! a few HTTP/2 connections. HTTP/2 sends the streams of a connection round-robin, a frame
//! each, and hands out the peer's connection-level flow-control window in the order streams
//! ask for it. So while hundreds of list bodies are being written on a connection, a small
//! response (aggregated discovery, which kube-apiserver's availability check and every
//! controller's discovery client need) waits behind a frame of every one of them: at 1,000
//! concurrent lists, tens of megabytes.
//!
//! Each connection therefore gets [`ConnectionSlots`]: at most [`BODY_SLOTS_PER_CONNECTION`]
//! list bodies are written at once; the others wait for a slot before their response starts.
//! A body holds its slot until it has been handed to the connection ([`SlottedBody`] yields
//! [`CHUNK`]-sized frames, and the server bounds each stream's send buffer), so at most a few
//! hundred kilobytes are ever queued ahead of a small response. The connection's throughput
//! is unchanged (it was the bottleneck already); discovery, health and single objects never
//! take a slot. HTTP/1.1 connections serve one request at a time and never wait. A request
//! that has to wait for a slot gives its in-flight seat back first ([`ConnectionSlots::with_seat`]):
//! its work is done, and a client whose streams never drain (a zero flow-control window)
//! must not hold the server's seats while its own connection is stuck.
//!
//! Each stream's future is first polled on the connection's own task ([`StreamExecutor`]):
//! a request answered at once (a cached object, discovery, health) needs no task of its own,
//! and its answer is written in the same turn of the connection's task as the others read
//! with it, so that they leave together ([`super::batch`]) instead of in a TLS record and a
//! `writev` each. Anything that waits, and anything about to compute (a listing not cached,
//! its first rendering, a selection or a Table not cached, a custom or external metrics
//! query: it yields once first, `api::before_computing`), goes on as a task of its own, so
//! no request holds up the connection's other streams while it computes.
//!
//! A stream lives at most [`StreamExecutor::bounded`]'s lifetime (the server's request timeout
//! plus its write timeout) from the moment hyper hands it over: a stream whose response
//! cannot be written (the peer never opens its flow-control window) is then dropped, which
//! resets it (`RST_STREAM CANCEL`) and frees its body, its slot and its task. This is the
//! point where every stream passes, so one timer per stream still waiting bounds them all;
//! a stream answered on its first poll never arms it.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use openmetrics::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::guard::Seat;

/// List bodies written at once on one connection.
pub const BODY_SLOTS_PER_CONNECTION: usize = 4;
/// Largest frame a [`SlottedBody`] yields: one HTTP/2 DATA frame at the default
/// `SETTINGS_MAX_FRAME_SIZE`.
pub const CHUNK: usize = 16 * 1024;
/// Send buffer of each HTTP/2 stream (hyper's default is 400 KiB): small enough that a body
/// is handed over as the connection drains, not all at once.
pub const STREAM_SEND_BUFFER: usize = 4 * CHUNK;

/// The body slots of one connection, put into every request's extensions by the server; the
/// copy a request holds may carry its in-flight seat ([`ConnectionSlots::with_seat`]).
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    seat: Seat,
}

impl Default for ConnectionSlots {
    fn default() -> Self {
        Self { slots: Arc::new(Semaphore::new(BODY_SLOTS_PER_CONNECTION)), seat: Seat::default() }
    }
}

impl ConnectionSlots {
    /// The same slots, for a request holding `seat`: given back if the request has to wait
    /// for a slot.
    pub fn with_seat(&self, seat: Seat) -> Self {
        Self { slots: Arc::clone(&self.slots), seat }
    }

    /// Waits for a slot (giving the request's seat back first if none is free) and returns
    /// `bytes` as a body that holds it until written.
    pub async fn body(&self, bytes: Bytes) -> SlottedBody {
        let permit = match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.seat.release();
                // The semaphore is never closed, so acquiring only fails if it were.
                Arc::clone(&self.slots).acquire_owned().await.ok()
            }
        };
        SlottedBody { bytes, permit }
    }

    /// Slots free right now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

/// hyper's executor for the streams of HTTP/2 connections: polls a stream's future once
/// where hyper hands it over (on the connection's task, as it reads the request) and spawns it
/// as a task of its own only if it is not done by then. A future polled first with a waker
/// that does nothing and then spawned is polled again at once by its task, which registers
/// the task's waker wherever the first poll waited. The default bounds no stream's lifetime;
/// a server uses [`StreamExecutor::bounded`].
#[derive(Debug, Clone, Default)]
pub struct StreamExecutor {
    /// The lifetime bound, and the counter of the streams it ended.
    bound: Option<(Duration, Counter)>,
}

impl StreamExecutor {
    /// Streams live at most `lifetime` from the moment hyper hands them over; each one still
    /// running then is dropped (reset) and counted in `timeouts`.
    pub fn bounded(lifetime: Duration, timeouts: Counter) -> Self {
        Self { bound: Some((lifetime, timeouts)) }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        match &self.bound {
            Some((lifetime, timeouts)) => {
                let (lifetime, timeouts) = (*lifetime, timeouts.clone());
                // The deadline is taken on the first poll, now; the timer is only registered
                // if the stream is not done on that poll.
                first_poll_then_spawn(async move {
                    if tokio::time::timeout(lifetime, future).await.is_err() {
                        timeouts.inc();
                        tracing::debug!(
                            ?lifetime,
                            "an HTTP/2 stream outlived the request and write timeouts; the stream is reset"
                        );
                    }
                });
            }
            None => first_poll_then_spawn(future),
        }
    }
}

/// Polls `future` once here, and spawns it only if it is not done.
fn first_poll_then_spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut future = Box::pin(future);
    let mut cx = Context::from_waker(Waker::noop());
    // A panic ends this stream (its future is dropped, which resets it), as it would end
    // a spawned task, not the connection's task.
    match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => {
            tokio::spawn(future);
        }
        Err(_) => tracing::error!("an HTTP/2 stream panicked on its first poll; the stream is reset"),
    }
}

/// Shared bytes sent as [`CHUNK`]-sized frames (zero-copy slices), holding a connection slot
/// until the last frame is taken or the body is dropped (the stream was reset).
#[derive(Debug)]
pub struct SlottedBody {
    bytes: Bytes,
    permit: Option<OwnedSemaphorePermit>,
}

impl Body for SlottedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.bytes.is_empty() {
            self.permit = None;
            return Poll::Ready(None);
        }
        let n = self.bytes.len().min(CHUNK);
        let chunk = self.bytes.split_to(n);
        if self.bytes.is_empty() {
            self.permit = None;
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_body_is_its_bytes_in_chunks_and_frees_its_slot_when_written() {
        let slots = ConnectionSlots::default();
        let bytes = Bytes::from((0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let mut body = slots.body(bytes.clone()).await;
        assert_eq!(body.size_hint().exact(), Some(100_000));
        assert_eq!(slots.available(), BODY_SLOTS_PER_CONNECTION - 1);
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= CHUNK);
            got.extend_from_slice(&data);
            frames += 1;
        }
        assert_eq!(got, bytes);
        assert_eq!(frames, 100_000usize.div_ceil(CHUNK));
        assert!(body.is_end_stream());
        assert_eq!(slots.available(), BODY_SLOTS_PER_CONNECTION, "freed after the last frame");
    }

    #[tokio::test]
    async fn bodies_wait_for_a_slot_and_a_dropped_body_frees_its_own() {
        let slots = ConnectionSlots::default();
        let mut held = Vec::new();
        for _ in 0..BODY_SLOTS_PER_CONNECTION {
            held.push(slots.body(Bytes::from_static(b"list")).await);
        }
        assert_eq!(slots.available(), 0);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.body(Bytes::from_static(b"next")).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a fifth body waits while four are being written");
        drop(held.pop()); // a reset stream
        let body = waiting.await.unwrap();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "next");
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn a_stream_answered_at_once_runs_where_it_is_handed_over_and_others_as_tasks() {
        use hyper::rt::Executor;
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = Arc::new(AtomicBool::new(false));
        StreamExecutor::default().execute({
            let done = Arc::clone(&done);
            async move { done.store(true, Ordering::SeqCst) }
        });
        assert!(done.load(Ordering::SeqCst), "finished before execute returned, without a task");

        // One that waits (here for a channel, registering the waker of its first poll, which
        // does nothing) finishes as a task once woken.
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        StreamExecutor::default().execute(async move {
            let _ = done_tx.send(rx.await.unwrap() + 1);
        });
        tx.send(41).unwrap();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx).await;
        assert_eq!(answer.unwrap().unwrap(), 42);

        // A request about to compute yields on its first poll, and goes on as a task.
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        StreamExecutor::default().execute(async move {
            tokio::task::yield_now().await;
            let _ = done_tx.send(());
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), done_rx).await.unwrap().unwrap();

        // A panic on the first poll ends that stream only.
        StreamExecutor::default().execute(async { panic!("a bug in one request") });
    }

    /// A stream still pending at the end of its lifetime is dropped (which resets it in
    /// hyper) and counted; one that ends in time is not, nor is anything unbounded.
    #[tokio::test]
    async fn a_bounded_stream_is_dropped_at_the_end_of_its_lifetime() {
        use hyper::rt::Executor;
        /// Sends on drop: the stream's future was dropped.
        struct Dropped(Option<tokio::sync::oneshot::Sender<std::time::Instant>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                let _ = self.0.take().map(|tx| tx.send(std::time::Instant::now()));
            }
        }
        let lifetime = Duration::from_millis(400);
        let timeouts = Counter::default();
        let executor = StreamExecutor::bounded(lifetime, timeouts.clone());
        let start = std::time::Instant::now();
        let (dropped_tx, dropped) = tokio::sync::oneshot::channel();
        executor.execute(async move {
            let _guard = Dropped(Some(dropped_tx));
            std::future::pending::<()>().await;
        });
        let (done_tx, done) = tokio::sync::oneshot::channel();
        executor.execute(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = done_tx.send(());
        });
        let (unbounded_tx, mut unbounded) = tokio::sync::oneshot::channel();
        StreamExecutor::default().execute(async move {
            let _guard = Dropped(Some(unbounded_tx));
            std::future::pending::<()>().await;
        });
        done.await.unwrap();
        let at = tokio::time::timeout(Duration::from_secs(5), dropped).await.unwrap().unwrap();
        let lived = at - start;
        assert!(lived >= lifetime && lived < lifetime * 3, "dropped after {lived:?}");
        assert_eq!(timeouts.get(), 1, "only the stream still pending is counted");
        assert!(unbounded.try_recv().is_err(), "the default bounds nothing");
    }

    /// A request that finds its connection's slots taken gives its seat back before it
    /// waits; one that gets a slot at once keeps it.
    #[tokio::test]
    async fn a_request_waiting_for_a_slot_gives_its_seat_back() {
        use crate::serve::guard::{Guard, admit};
        let guard = Guard::new(8, Duration::from_secs(60));
        let uri: http::Uri = "/apis/g/v/widgets".parse().unwrap();
        let admission = || {
            admit(
                &guard,
                &http::Method::GET,
                &uri,
                &http::HeaderMap::new(),
                &k8s_wire::QueryParams::default(),
            )
            .unwrap()
        };
        let slots = ConnectionSlots::default();
        let mut held = Vec::new();
        for _ in 0..BODY_SLOTS_PER_CONNECTION {
            let first = admission();
            held.push(slots.with_seat(first.seat()).body(Bytes::from_static(b"list")).await);
            assert!(first.seat().is_held(), "a slot was free: the seat is kept");
        }
        let waiting = admission();
        let seat = waiting.seat();
        let body = tokio::spawn({
            let slots = slots.with_seat(waiting.seat());
            async move { slots.body(Bytes::from_static(b"next")).await }
        });
        tokio::time::timeout(Duration::from_secs(5), async {
            while seat.is_held() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the seat is given back while the request waits");
        assert!(!body.is_finished());
        drop(held.pop());
        assert_eq!(body.await.unwrap().collect().await.unwrap().to_bytes(), "next");
    }

    #[tokio::test]
    async fn an_empty_body_frees_its_slot_at_once() {
        let slots = ConnectionSlots::default();
        let mut body = slots.body(Bytes::new()).await;
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        assert_eq!(slots.available(), BODY_SLOTS_PER_CONNECTION);
    }
}
