//! The `bpf(2)` system call made raw, for what aya 0.16 has no operation for: creating and
//! filling a scratch map (`batch`) and the links of USDT sites with semaphores
//! (`crate::spans::usdt::attach`).

use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

/// `bpf(command, attr, sizeof attr)`: its non-negative result, or the error it set.
pub(crate) fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid prefix of `union bpf_attr` for `command`, of the size given;
    // the pointers it holds outlive the call.
    let status = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if status < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(status)
    }
}

/// `bpf` for a command that returns a new file descriptor (a map, a link), owned.
pub(crate) fn bpf_fd<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
