//! What the commands' event loops wait on: the session's fds (the exit ring buffer, BPF logs),
//! the watched processes' ends and an optional deadline. An absent source never fires, so a
//! `tokio::select!` can list every source whether or not this run has it.

use std::os::fd::RawFd;

use anyhow::Result;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use crate::session::target::ProcessWatch;

/// A borrowed fd for `AsyncFd` (the session owns the real one and outlives the loop).
pub struct FdRef(RawFd);

impl std::os::fd::AsRawFd for FdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Registers a session-owned fd with the event loop.
pub fn register(fd: RawFd) -> Result<AsyncFd<FdRef>> {
    // SAFETY: the session owns the fd and outlives the event loop that polls it.
    unsafe { AsyncFd::register(FdRef(fd)) }.map_err(|err| anyhow::anyhow!("{err}"))
}

/// Readable `fd`; never, without one.
pub async fn readable(
    fd: Option<&AsyncFd<FdRef>>,
) -> std::io::Result<AsyncFdReadyGuard<'_, FdRef>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// At `deadline`; never, without one.
pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Index of the first watched process to exit.
pub async fn first_exit(watches: &[ProcessWatch]) -> Result<usize> {
    let mut waits: Vec<_> = watches
        .iter()
        .enumerate()
        .map(|(index, watch)| {
            Box::pin(async move {
                watch.exited().await?;
                Ok::<usize, anyhow::Error>(index)
            })
        })
        .collect();
    std::future::poll_fn(move |cx| {
        for future in &mut waits {
            if let std::task::Poll::Ready(output) = future.as_mut().poll(cx) {
                return std::task::Poll::Ready(output);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
