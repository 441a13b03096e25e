//! A deadline on writes to an accepted connection that stop making progress.
//!
//! hyper has no write timeout: a client that asks for a page of messages and never reads it
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

use crate::limits::WRITE_STALL_TIMEOUT;

pub struct WriteDeadline<IO> {
    io: IO,
    /// Armed when a write first had to wait; disarmed when one makes progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> WriteDeadline<IO> {
    pub fn new(io: IO) -> Self {
        Self { io, stalled: None }
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

impl<IO: AsyncRead + Unpin> AsyncRead for WriteDeadline<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<IO> {
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
    async fn a_write_that_waits_too_long_fails() {
        let (_client, server) = tokio::io::duplex(16);
        let mut server = WriteDeadline::new(server);
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
        let mut server = WriteDeadline::new(server);
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
