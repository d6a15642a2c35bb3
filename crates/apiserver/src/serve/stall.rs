//! A bound on a peer that stops reading: [`StallGuard`] wraps a connection's socket (under
//! TLS) and fails a write that has made no progress for the write timeout, as Go's HTTP/2
//! server does with `WriteByteTimeout`. The timer starts when a write first finds the socket
//! full and is cleared by any byte written, so a slow reader that keeps reading is never cut
//! by it (the per-response bound is elsewhere: `super::fairness::StreamExecutor` for HTTP/2
//! streams, the response body's deadline in `super::listener` for HTTP/1.1). Once it fires,
//! every later write and flush fails too, so hyper, rustls and the batching layer all see the
//! connection as broken and end it; nothing else is needed to free what the connection holds.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A socket whose writes fail after `timeout` without progress ([module docs](self)).
pub struct StallGuard<T> {
    io: T,
    timeout: Duration,
    /// The running timer, when a write is waiting for the socket.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// Set once the timeout has fired (shared with the connection, to name why it ended).
    stalled: Arc<AtomicBool>,
}

impl<T> StallGuard<T> {
    /// Wraps `io`; `stalled` is set when the timeout fires.
    pub fn new(io: T, timeout: Duration, stalled: Arc<AtomicBool>) -> Self {
        Self { io, timeout, timer: None, armed: false, stalled }
    }

    /// The error of a stalled connection.
    fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("nothing could be written to the client for {:?}", self.timeout),
        )
    }

    /// The outcome of a write-side call that returned `result`: progress clears the timer, a
    /// wait starts it (once) and fails once it has run out.
    fn check<R>(&mut self, cx: &mut Context<'_>, result: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match result {
            Poll::Ready(result) => {
                self.armed = false;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let deadline = Instant::now() + self.timeout;
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !self.armed {
                    timer.as_mut().reset(deadline);
                    self.armed = true;
                }
                ready!(timer.as_mut().poll(cx));
                self.stalled.store(true, Ordering::SeqCst);
                Poll::Ready(Err(self.error()))
            }
        }
    }

    fn broken(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.broken() {
            return Poll::Ready(Err(self.error()));
        }
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.check(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.broken() {
            return Poll::Ready(Err(self.error()));
        }
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.check(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.broken() {
            return Poll::Ready(Err(self.error()));
        }
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.broken() {
            return Poll::Ready(Err(self.error()));
        }
        let result = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair of loopback sockets with small buffers (the accepted socket inherits
    /// the listener's), so that a peer that does not read fills them quickly.
    async fn mk_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4096).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(16).unwrap();
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(4096).unwrap();
        let (client, accepted) =
            tokio::join!(client.connect(listener.local_addr().unwrap()), listener.accept());
        let (server, _) = accepted.unwrap();
        (server, client.unwrap())
    }

    /// Writes 1 KiB pieces until a write fails; how many bytes went through and the error.
    async fn mk_flood(io: &mut StallGuard<tokio::net::TcpStream>) -> (usize, io::Error) {
        let piece = [7u8; 1024];
        let mut written = 0;
        loop {
            match io.write(&piece).await {
                Ok(n) => written += n,
                Err(error) => return (written, error),
            }
        }
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_fails_the_writes_after_the_timeout() {
        let (server, _client) = mk_pair().await;
        let stalled = Arc::new(AtomicBool::new(false));
        let timeout = Duration::from_millis(300);
        let mut io = StallGuard::new(server, timeout, stalled.clone());
        let start = std::time::Instant::now();
        let (written, error) = mk_flood(&mut io).await;
        let took = start.elapsed();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert!(written > 0 && written < 16 * 1024 * 1024, "{written} bytes went into the buffers");
        assert!(took >= timeout && took < timeout * 10, "{took:?}");
        assert!(stalled.load(Ordering::SeqCst));
        // Broken for good: a flush fails at once.
        assert_eq!(io.flush().await.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_not_cut() {
        let (server, mut client) = mk_pair().await;
        let stalled = Arc::new(AtomicBool::new(false));
        let mut io = StallGuard::new(server, Duration::from_millis(300), stalled.clone());
        // The reader takes a little every 5 ms: writes wait, but never 300 ms in a row.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut total = 0;
            while total < 256 * 1024 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
            total
        });
        let piece = [1u8; 1024];
        for _ in 0..256 {
            io.write_all(&piece).await.unwrap();
        }
        io.flush().await.unwrap();
        drop(io);
        assert_eq!(reader.await.unwrap(), 256 * 1024);
        assert!(!stalled.load(Ordering::SeqCst));
    }
}
