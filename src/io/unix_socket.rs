//! Unix sockets at paths of any length.
//!
//! A Unix socket's address holds at most 107 bytes of path, so a socket in a store
//! deep in the file system (`DIR/control.sock`, `DIR/nbd.sock`) could be neither
//! bound nor reached by its path. A longer path is reached through the directory:
//! opened, it is `/proc/self/fd/N`, and `/proc/self/fd/N/NAME` is a short path to
//! the same socket file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The most path bytes a `sockaddr_un` holds, with its closing NUL.
const SUN_PATH_BYTES: usize = 108;

/// Connects to the Unix socket at `path`.
pub fn connect_unix(path: &Path) -> io::Result<UnixStream> {
    via_short_path(path, |p| UnixStream::connect(p))
}

/// Binds a Unix socket at `path`.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    via_short_path(path, |p| UnixListener::bind(p))
}

/// Runs `f` on `path`, or, when `path` is too long for a socket address, on a short
/// path to the same file through its directory (held open while `f` runs).
fn via_short_path<T>(path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    if path.as_os_str().len() < SUN_PATH_BYTES {
        return f(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return f(path);
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let handle = File::open(dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd())).join(name);
    if short.as_os_str().len() >= SUN_PATH_BYTES {
        // The name alone is too long: the error is the plain path's.
        return f(path);
    }
    f(&short)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_socket_deeper_than_an_address_holds_is_bound_and_reached() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d".repeat(120));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("control.sock");
        assert!(path.as_os_str().len() >= SUN_PATH_BYTES);
        assert!(
            UnixListener::bind(&path).is_err(),
            "the plain path is too long"
        );

        let listener = bind_unix(&path).unwrap();
        assert!(path.exists(), "the socket file is where its path says");
        let mut client = connect_unix(&path).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }

    #[test]
    fn a_short_path_is_used_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let _listener = bind_unix(&path).unwrap();
        connect_unix(&path).unwrap();
        let missing = connect_unix(&tmp.path().join("none.sock")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }
}
