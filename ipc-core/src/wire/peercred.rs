//! `getsockopt(SO_PEERCRED)`, read into plain integers.
//!
//! Why not `rustix::net::sockopt::socket_peercred`: its `UCred` holds the pid as a `Pid`, a non-zero integer, and
//! the kernel answers pid 0 for a peer outside the caller's PID namespace (two containers sharing a socket
//! directory; see `SO_PEERCRED` in [unix(7)](https://man7.org/linux/man-pages/man7/unix.7.html) and
//! `cred_to_ucred`, which translates the pid with `pid_vnr`). A zero there is an invalid value of that type: in
//! practice the call came back as `Err(Errno(0))`, "getsockopt(SO_PEERCRED) failed: Success (os error 0)", and any
//! other outcome would be no better. Reading the kernel's `struct ucred` as three integers has no invalid value.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// What the kernel recorded about the peer of a Unix socket when the connection was made (`connect` or
/// `socketpair`), not something the peer claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPeerCred {
    /// The peer's pid as this process's PID namespace sees it; 0 when the peer's process is not visible from it
    /// (the peer lives in a PID namespace that is not this one or one of its descendants).
    pub pid: i32,
    /// The peer's effective uid, as this process's user namespace sees it (the overflow uid, usually 65534, when
    /// it is not mapped there).
    pub uid: u32,
    /// The peer's effective gid, likewise.
    pub gid: u32,
}

/// `getsockopt(fd, SOL_SOCKET, SO_PEERCRED)`.
///
/// # Errors
/// The call's errno (`ENOTSOCK`, `ENOPROTOOPT` for a socket that is not a connected Unix socket, ...).
pub fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<RawPeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `fd` is a live descriptor for the duration of the call (borrowed); the kernel writes at most `len`
    // bytes into `cred`, a properly aligned, initialised `struct ucred` of exactly `len` bytes, whose three
    // integer fields accept every bit pattern.
    let result = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::other(format!(
            "getsockopt(SO_PEERCRED) returned {len} bytes, expected {}",
            size_of::<libc::ucred>()
        )));
    }
    Ok(RawPeerCred { pid: cred.pid, uid: cred.uid, gid: cred.gid })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn a_socketpair_names_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_credentials(a.as_fd()).unwrap();
        assert_eq!(cred.pid, rustix::process::getpid().as_raw_pid());
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getegid().as_raw());
    }

    #[test]
    fn a_file_is_not_a_socket() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let error = peer_credentials(file.as_fd()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOTSOCK));
    }
}
