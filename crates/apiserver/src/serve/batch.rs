//! Writes of one turn of a connection's task, sent together.
//!
//! hyper's HTTP/2 server flushes its connection each time it looks for the next request, so
//! when the requests of one read are answered at once ([`super::fairness::StreamExecutor`]),
//! each answer would still leave in a TLS record and a `writev` of its own. A connection's
//! transport is therefore split in two halves sharing one buffer: [`BatchedIo`], which hyper
//! writes to and flushes (a flush only marks the bytes as due), and [`FlushAfterTurn`], which
//! drives the connection and, after every turn of it, writes what is due to the TLS stream
//! and flushes it. Nothing waits longer than the turn that wrote it, and at most
//! [`MAX_BUFFERED`] bytes are held before hyper is made to wait for the socket.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held for the end of a turn before writes go to the stream at once: four TLS records.
pub const MAX_BUFFERED: usize = 64 * 1024;
/// Writes this large (a list body's frame) go to the stream at once, after what is held:
/// they fill TLS records of their own and are not copied.
pub const DIRECT_WRITE: usize = 16 * 1024;
/// The buffer kept between turns at most; a larger one (after a burst) is freed once sent.
const KEPT_CAPACITY: usize = 16 * 1024;

/// The stream and the bytes written to it but not yet sent, shared by the two halves. Both are
/// used by the connection's task only, one after the other, so the lock is never contended.
struct Shared<T> {
    io: T,
    out: Vec<u8>,
    /// hyper asked for a flush since the stream was last flushed.
    flush_due: bool,
    /// Sending at the end of a turn failed: hyper is told on its next write or flush.
    broken: Option<(io::ErrorKind, String)>,
}

/// Splits `io` into the transport hyper serves on and the wrapper for the future that serves
/// the connection ([`Flusher::around`]).
pub fn split<T>(io: T) -> (BatchedIo<T>, Flusher<T>) {
    let shared = Arc::new(Mutex::new(Shared { io, out: Vec::new(), flush_due: false, broken: None }));
    (BatchedIo(Arc::clone(&shared)), Flusher(shared))
}

fn lock<T>(shared: &Mutex<Shared<T>>) -> MutexGuard<'_, Shared<T>> {
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<T: AsyncWrite + Unpin> Shared<T> {
    /// Writes the held bytes to the stream until they are all written or it would block.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut sent = 0;
        let result = loop {
            if sent == self.out.len() {
                break Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.io).poll_write(cx, &self.out[sent..]) {
                Poll::Ready(Ok(0)) => break Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => sent += n,
                Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                Poll::Pending => break Poll::Pending,
            }
        };
        if sent == self.out.len() && self.out.capacity() > KEPT_CAPACITY {
            self.out = Vec::new();
        } else {
            self.out.drain(..sent);
        }
        result
    }

    /// The error of a failed send, for hyper.
    fn check(&self) -> io::Result<()> {
        match &self.broken {
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
            None => Ok(()),
        }
    }

    /// Sends the held bytes and, if hyper asked for it, flushes the stream.
    fn poll_flush_due(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send(cx))?;
        if self.flush_due {
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.flush_due = false;
        }
        Poll::Ready(Ok(()))
    }
}

/// The transport hyper serves a connection on: reads go to the stream, writes are held until
/// the end of the task's turn ([`FlushAfterTurn`]) or until [`MAX_BUFFERED`] bytes are held.
pub struct BatchedIo<T>(Arc<Mutex<Shared<T>>>);

impl<T: AsyncRead + Unpin> AsyncRead for BatchedIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.0).io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BatchedIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut shared = lock(&self.0);
        shared.check()?;
        if bufs.iter().map(|buf| buf.len()).sum::<usize>() >= DIRECT_WRITE {
            ready!(shared.poll_send(cx))?;
            return Pin::new(&mut shared.io).poll_write_vectored(cx, bufs);
        }
        if shared.out.len() >= MAX_BUFFERED {
            ready!(shared.poll_send(cx))?;
        }
        let mut n = 0;
        for buf in bufs {
            shared.out.extend_from_slice(buf);
            n += buf.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Marks the held bytes as due; [`FlushAfterTurn`] sends them when the turn ends.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.0);
        shared.check()?;
        shared.flush_due = true;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.0);
        shared.check()?;
        shared.flush_due = true;
        ready!(shared.poll_flush_due(cx))?;
        Pin::new(&mut shared.io).poll_shutdown(cx)
    }
}

/// The other half of [`split`]: wraps the future serving the connection.
pub struct Flusher<T>(Arc<Mutex<Shared<T>>>);

impl<T> Flusher<T> {
    /// `serving`, followed after each of its turns by sending what it wrote.
    pub fn around<F: Future>(self, serving: F) -> FlushAfterTurn<T, F> {
        FlushAfterTurn { shared: self.0, serving: Box::pin(serving), output: None }
    }
}

/// A connection's serving future that sends, after each of its turns, what the turn wrote;
/// it ends once the connection has ended and its last bytes are sent.
pub struct FlushAfterTurn<T, F: Future> {
    shared: Arc<Mutex<Shared<T>>>,
    serving: Pin<Box<F>>,
    /// The connection's outcome, once it has ended.
    output: Option<F::Output>,
}

impl<T: AsyncWrite + Unpin, F: Future<Output: Unpin>> Future for FlushAfterTurn<T, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.output.is_none()
            && let Poll::Ready(output) = self.serving.as_mut().poll(cx)
        {
            self.output = Some(output);
        }
        let sent = {
            let mut shared = lock(&self.shared);
            match shared.broken {
                Some(_) => true,
                // Pending: the stream wakes the task when it can take more, and a later turn
                // sends the rest.
                None => match shared.poll_flush_due(cx) {
                    Poll::Ready(Ok(())) => true,
                    Poll::Ready(Err(error)) => {
                        shared.broken = Some((error.kind(), error.to_string()));
                        shared.out = Vec::new();
                        // One more turn, for hyper to meet the error and end the connection.
                        cx.waker().wake_by_ref();
                        true
                    }
                    Poll::Pending => false,
                },
            }
        };
        match self.output.take() {
            Some(output) if sent => Poll::Ready(output),
            output => {
                self.output = output;
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A stream that records each write call, and can be made to block or fail.
    #[derive(Default)]
    struct Recorded {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        shutdown: bool,
        blocked: bool,
        fail: bool,
    }

    #[derive(Clone, Default)]
    struct Mock(Arc<Mutex<Recorded>>);

    impl Mock {
        fn get(&self) -> MutexGuard<'_, Recorded> {
            self.0.lock().unwrap()
        }
    }

    impl AsyncWrite for Mock {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let mut r = self.get();
            if r.fail {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            if r.blocked {
                return Poll::Pending;
            }
            r.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get().shutdown = true;
            Poll::Ready(Ok(()))
        }
    }

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    fn write(io: &mut BatchedIo<Mock>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(io).poll_write(&mut cx(), bytes)
    }

    fn flush(io: &mut BatchedIo<Mock>) -> Poll<io::Result<()>> {
        Pin::new(io).poll_flush(&mut cx())
    }

    /// A connection whose turns are played by `turn`, called with the turn's number; the
    /// connection ends when it returns true.
    fn serving(
        mock: &Mock,
        mut turn: impl FnMut(usize, &mut BatchedIo<Mock>) -> bool + Unpin,
    ) -> FlushAfterTurn<Mock, impl Future<Output = ()>> {
        let (mut io, flusher) = split(mock.clone());
        let mut turns = 0;
        flusher.around(std::future::poll_fn(move |_| {
            turns += 1;
            if turn(turns, &mut io) { Poll::Ready(()) } else { Poll::Pending }
        }))
    }

    fn play<F: Future<Output: Unpin>>(connection: &mut FlushAfterTurn<Mock, F>) -> Poll<F::Output> {
        Pin::new(connection).poll(&mut cx())
    }

    #[test]
    fn the_writes_of_one_turn_leave_together_after_it() {
        let mock = Mock::default();
        let mut connection = serving(&mock, |turn, io| {
            if turn == 1 {
                for answer in [&b"first"[..], b"second", b"third"] {
                    assert!(matches!(write(io, answer), Poll::Ready(Ok(n)) if n == answer.len()));
                    assert!(matches!(flush(io), Poll::Ready(Ok(()))));
                    // hyper's flush returned, but nothing has been sent yet.
                }
            }
            false
        });
        assert!(mock.get().writes.is_empty());
        assert!(play(&mut connection).is_pending());
        assert_eq!(mock.get().writes, [b"firstsecondthird".to_vec()]);
        assert_eq!(mock.get().flushes, 1);
        // A turn that writes nothing sends and flushes nothing.
        assert!(play(&mut connection).is_pending());
        assert_eq!(mock.get().writes.len(), 1);
        assert_eq!(mock.get().flushes, 1);
    }

    #[test]
    fn large_writes_go_out_at_once_after_the_bytes_held_before_them() {
        let mock = Mock::default();
        let frame = vec![7u8; DIRECT_WRITE];
        let mut connection = serving(&mock, |turn, io| {
            if turn == 1 {
                assert!(write(io, b"head").is_ready());
                assert!(matches!(write(io, &frame), Poll::Ready(Ok(n)) if n == DIRECT_WRITE));
                assert_eq!(mock.get().writes, [b"head".to_vec(), frame.clone()], "in order, during the turn");
                assert!(write(io, b"tail").is_ready());
            }
            false
        });
        assert!(play(&mut connection).is_pending());
        assert_eq!(mock.get().writes.len(), 3);
        assert_eq!(mock.get().writes[2], b"tail");
    }

    #[test]
    fn a_blocked_stream_holds_at_most_the_bound_and_sends_the_rest_later() {
        let mock = Mock(Arc::new(Mutex::new(Recorded { blocked: true, ..Recorded::default() })));
        let piece = vec![1u8; 1024];
        let mut accepted = 0;
        let mut connection = serving(&mock, |turn, io| {
            if turn == 1 {
                while let Poll::Ready(Ok(n)) = write(io, &piece) {
                    accepted += n;
                    assert!(accepted <= MAX_BUFFERED + piece.len(), "unbounded");
                }
                assert_eq!(accepted, MAX_BUFFERED, "hyper waits once the bound is reached");
            }
            false
        });
        assert!(play(&mut connection).is_pending());
        assert!(mock.get().writes.is_empty());
        mock.get().blocked = false;
        assert!(play(&mut connection).is_pending());
        assert_eq!(mock.get().writes.iter().map(Vec::len).sum::<usize>(), MAX_BUFFERED);
    }

    #[test]
    fn a_failed_send_is_reported_to_hypers_next_write_and_flush() {
        let mock = Mock(Arc::new(Mutex::new(Recorded { fail: true, ..Recorded::default() })));
        let mut connection = serving(&mock, |turn, io| match turn {
            1 => {
                assert!(write(io, b"answer").is_ready());
                assert!(flush(io).is_ready());
                false
            }
            _ => {
                assert!(
                    matches!(write(io, b"next"), Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe)
                );
                assert!(matches!(flush(io), Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe));
                true
            }
        });
        assert!(play(&mut connection).is_pending());
        assert!(play(&mut connection).is_ready());
    }

    #[test]
    fn a_connection_ends_once_its_last_bytes_are_sent() {
        let mock = Mock(Arc::new(Mutex::new(Recorded { blocked: true, ..Recorded::default() })));
        let mut connection = serving(&mock, |turn, io| {
            assert_eq!(turn, 1, "an ended connection is not polled again");
            assert!(write(io, b"last").is_ready());
            true
        });
        assert!(play(&mut connection).is_pending(), "ended, but its last answer is still held");
        mock.get().blocked = false;
        assert!(play(&mut connection).is_ready());
        assert_eq!(mock.get().writes, [b"last".to_vec()]);
    }

    #[test]
    fn shutting_down_sends_what_is_held_first() {
        let mock = Mock::default();
        let mut connection = serving(&mock, |_, io| {
            assert!(write(io, b"goodbye").is_ready());
            assert!(matches!(Pin::new(io).poll_shutdown(&mut cx()), Poll::Ready(Ok(()))));
            true
        });
        assert!(play(&mut connection).is_ready());
        let recorded = mock.get();
        assert_eq!(recorded.writes, [b"goodbye".to_vec()]);
        assert_eq!(recorded.flushes, 1);
        assert!(recorded.shutdown);
    }
}
