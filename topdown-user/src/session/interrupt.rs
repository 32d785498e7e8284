//! SIGINT and SIGTERM while topdown is not in its event loop.
//!
//! The event loops (`stat`, `top`, `serve`) take these signals through tokio and end the run
//! with a report. Before a loop runs, topdown reads symbols and attaches probes, which can take
//! many seconds for a whole library (`-u 'libc:*'`), and after it, the probe calibration runs:
//! tokio's handler would only queue the signal until then. Here a handler of our own, installed
//! after tokio's, ends topdown at once in those phases (exit status 128 + signal, one line on
//! stderr) and hands the signal to tokio's handler otherwise.
//!
//! Ending at once leaves nothing attached: every probe, link and counter is a file descriptor
//! the kernel closes at exit (semaphores go back with their links), and a command held before
//! its exec sees its pipe close and exits without running.

use std::{
    io,
    sync::{
        Once,
        atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering},
    },
};

/// What topdown is doing, as the signal handler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// An event loop takes the signals (or no guard was installed).
    Counting = 0,
    /// Reading symbols, attaching, starting the command.
    SettingUp = 1,
    /// Measuring the probes' cost.
    Calibrating = 2,
}

static PHASE: AtomicU8 = AtomicU8::new(Phase::Counting as u8);

/// The handler installed before ours (tokio's), per signal: its `sa_sigaction` and `sa_flags`.
struct Previous {
    handler: AtomicUsize,
    flags: AtomicI32,
}

static PREVIOUS_INT: Previous = Previous {
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
};
static PREVIOUS_TERM: Previous = Previous {
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
};

fn previous(signal: libc::c_int) -> &'static Previous {
    if signal == libc::SIGINT {
        &PREVIOUS_INT
    } else {
        &PREVIOUS_TERM
    }
}

/// Enters `phase`; returns the phase it replaces.
pub fn set(phase: Phase) -> Phase {
    match PHASE.swap(phase as u8, Ordering::SeqCst) {
        1 => Phase::SettingUp,
        2 => Phase::Calibrating,
        _ => Phase::Counting,
    }
}

/// Installs the handler (once per process; call it after tokio's signal handlers are
/// registered, so theirs is the one ours hands signals to) and enters `Phase::SettingUp`.
pub fn guard_setup() -> io::Result<()> {
    static INSTALLED: Once = Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| result = install());
    set(Phase::SettingUp);
    result
}

fn install() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: plain C structs, zeroed then filled; sigaction copies them.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, &action, &mut old) != 0 {
                return Err(io::Error::last_os_error());
            }
            let slot = previous(signal);
            slot.handler.store(old.sa_sigaction, Ordering::SeqCst);
            slot.flags.store(old.sa_flags, Ordering::SeqCst);
        }
    }
    Ok(())
}

/// Async-signal-safe: atomics, write(2) and _exit(2) only.
extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let phase = PHASE.load(Ordering::SeqCst);
    if phase != Phase::Counting as u8 {
        let message: &[u8] = if phase == Phase::Calibrating as u8 {
            b"topdown: interrupted while calibrating the probes: no report; nothing is left attached\n"
        } else {
            b"topdown: interrupted while setting up (reading symbols, attaching): nothing was counted and nothing is left attached\n"
        };
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, message.as_ptr().cast(), message.len());
            libc::_exit(128 + signal);
        }
    }
    let slot = previous(signal);
    let handler = slot.handler.load(Ordering::SeqCst);
    let flags = slot.flags.load(Ordering::SeqCst);
    match handler {
        libc::SIG_IGN => {}
        // SAFETY: as above: the default action of both signals ends the process.
        libc::SIG_DFL => unsafe { libc::_exit(128 + signal) },
        // SAFETY: the handler sigaction gave us, called as it was installed to be.
        _ if flags & libc::SA_SIGINFO != 0 => unsafe {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            handler(signal, info, context);
        },
        // SAFETY: as above, a plain `sa_handler`.
        _ => unsafe {
            let handler: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            handler(signal);
        },
    }
}
