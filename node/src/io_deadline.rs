//! Deadlines on an accepted connection: on its first byte, and on writes that stop making
//! progress.
//!
//! A client that connects and sends nothing must not hold its connection forever. hyper's
//! header read timeout covers that today, but it lives in hyper's internals (its auto HTTP/1
//! or HTTP/2 server, used here before, read the version bytes with no timer at all): here the
//! connection's first byte must arrive within [`HEADER_READ_TIMEOUT`] of the accept whatever
//! hyper does; after it, hyper's timers (and an upgraded WebSocket's pings) take over.
//!
//! hyper has no write timeout either: a client that asks for a page of messages and never reads it
//! holds the response, and the share of the read budget it counts against, for as long as it
//! keeps the connection open. Here a write that has waited [`WRITE_STALL_TIMEOUT`] for room
//! fails, and hyper drops the connection with what it held. Only a write that waits arms a
//! timer; writes that go out at once, nearly all of them, cost nothing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::limits::{HEADER_READ_TIMEOUT, WRITE_STALL_TIMEOUT};

pub struct IoDeadline<IO> {
    io: IO,
    /// The connection's place among the node's connections (`serve.rs`), held as long as the
    /// connection: an upgraded WebSocket keeps this IO, and so its place.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Armed at the accept; disarmed by the first byte read (or the end of the stream).
    first_byte: Option<Pin<Box<Sleep>>>,
    /// Armed when a write first had to wait; disarmed when one makes progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> IoDeadline<IO> {
    /// Wraps a connection just accepted: its first byte is due within [`HEADER_READ_TIMEOUT`].
    pub fn new(io: IO) -> Self {
        Self { io, _place: None, first_byte: Some(Box::pin(tokio::time::sleep(HEADER_READ_TIMEOUT))), stalled: None }
    }

    /// Holds `place` until the connection is dropped.
    pub fn holding(mut self, place: tokio::sync::OwnedSemaphorePermit) -> Self {
        self._place = Some(place);
        self
    }

    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(done) = poll {
            self.stalled = None;
            return Poll::Ready(done);
        }
        let deadline = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client read nothing for {WRITE_STALL_TIMEOUT:?}"),
        )))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IoDeadline<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some(deadline) = this.first_byte.as_mut() else { return poll };
        if poll.is_ready() {
            // A byte, the end of the stream or an error: the wait for a first byte is over.
            this.first_byte = None;
            return poll;
        }
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client sent nothing within {HEADER_READ_TIMEOUT:?} of connecting"),
        )))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IoDeadline<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.guard(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.guard(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.guard(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_fails_its_first_read_in_time() {
        let (_client, server) = tokio::io::duplex(16);
        let mut server = IoDeadline::new(server);
        let started = tokio::time::Instant::now();
        let failed = server.read(&mut [0; 1]).await.expect_err("the client sends nothing");
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), HEADER_READ_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn after_its_first_byte_a_connection_may_stay_quiet() {
        let (mut client, server) = tokio::io::duplex(16);
        let mut server = IoDeadline::new(server);
        tokio::time::sleep(HEADER_READ_TIMEOUT / 2).await;
        client.write_all(b"G").await.expect("write");
        assert_eq!(server.read(&mut [0; 1]).await.expect("the first byte"), 1);
        // Quiet for much longer than the first byte's deadline: hyper's own timers judge that.
        let later = tokio::spawn(async move {
            tokio::time::sleep(HEADER_READ_TIMEOUT * 4).await;
            client.write_all(b"ET").await.expect("write");
            client
        });
        let mut rest = [0; 2];
        server.read_exact(&mut rest).await.expect("no deadline after the first byte");
        assert_eq!(&rest, b"ET");
        drop(later.await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_too_long_fails() {
        let (_client, server) = tokio::io::duplex(16);
        let mut server = IoDeadline::new(server);
        // Fits the pipe: goes out at once.
        server.write_all(&[0; 16]).await.expect("room for it");
        // No room until the client reads, which it never does.
        let started = tokio::time::Instant::now();
        let failed = server.write_all(&[0; 1]).await.expect_err("the client reads nothing");
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= WRITE_STALL_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_keeps_the_writes_going_however_long_they_take_in_all() {
        let (mut client, server) = tokio::io::duplex(1);
        let mut server = IoDeadline::new(server);
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            for _ in 0..4 {
                tokio::time::sleep(WRITE_STALL_TIMEOUT / 2).await;
                client.read_exact(&mut byte).await.expect("read");
            }
        });
        let started = tokio::time::Instant::now();
        server.write_all(&[0; 4]).await.expect("a slow reader is still a reader");
        assert!(started.elapsed() > WRITE_STALL_TIMEOUT);
        reader.await.expect("reader");
    }
}
