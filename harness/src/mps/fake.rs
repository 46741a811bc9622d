//! A fake `nvidia-cuda-mps-control` for the tests of code that starts a private MPS daemon (the harness's own, the
//! report's, the benchmark's): a shell script that plays the daemon, so those tests run on machines without MPS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{MPS_CONTROL, MpsControl, find_on_path};

/// Writes an executable `#!/bin/sh` script `name` with `body` into `dir`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A fake `nvidia-cuda-mps-control`: `-d` starts a `sleep` as the "daemon" and writes its pid file; a client
/// call answers while the pid file exists and records its stdin; `quit` kills the daemon and removes the file.
/// Every call is appended to `calls` with the pipe directory it was given. `START_FAILS` in the fake's folder
/// makes `-d` fail; `MUTE` makes the daemon not answer.
pub const FAKE_MPS: &str = r#"
here="$(dirname "$0")"
pidfile="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
if [ "$1" = "-d" ]; then
echo "-d $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >>"$here/calls"
if [ -e "$here/START_FAILS" ]; then echo "An instance of this daemon is already running" >&2; exit 1; fi
sleep 60 >/dev/null 2>&1 &
echo $! >"$pidfile"
echo "daemon started" >"$CUDA_MPS_LOG_DIRECTORY/control.log"
exit 0
fi
read -r line
echo "$line $CUDA_MPS_PIPE_DIRECTORY" >>"$here/calls"
[ -e "$pidfile" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
case "$line" in
get_server_list) [ -e "$here/MUTE" ] && exit 1; exit 0 ;;
quit) kill "$(cat "$pidfile")"; rm -f "$pidfile"; exit 0 ;;
esac
exit 1
"#;

/// Installs [`FAKE_MPS`] in `dir` and an [`MpsControl`] that finds it first on a PATH (2 s ready timeout).
pub fn fake_control(dir: &Path) -> MpsControl {
    script(dir, MPS_CONTROL, FAKE_MPS);
    std::fs::write(dir.join("calls"), "").unwrap();
    // Found the way the real one is: first on a PATH.
    let path = std::env::join_paths([dir.to_path_buf(), PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap();
    let program = find_on_path(MPS_CONTROL, &path);
    assert_eq!(program.as_deref(), Some(dir.join(MPS_CONTROL).as_path()));
    let mut control = MpsControl::with_program(program);
    control.ready_timeout = Duration::from_secs(2);
    control
}

/// The calls the fake recorded, one line each.
pub fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls")).unwrap().lines().map(str::to_owned).collect()
}
