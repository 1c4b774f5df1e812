//! Shared helpers of the local backends: child processes on loopback ports (free port,
//! command template, spawn, readiness wait, stop).

use std::ffi::OsString;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use http::Uri;

use super::BackendError;
use crate::net::client::UpstreamClient;

/// Placeholder replaced by the instance's port in a command template.
pub const PORT_PLACEHOLDER: &str = "{port}";
/// Placeholder replaced by the path of the spillway binary in a command template.
pub const SPILLWAY_PLACEHOLDER: &str = "{spillway}";

/// A free TCP port on 127.0.0.1: binds port 0, reads the port the OS chose, and releases
/// it. Another process may take the port before the child binds it; the child then fails
/// to start and the readiness wait reports it.
///
/// # Errors
/// [`BackendError::Provider`] when no port can be bound.
pub fn free_port() -> Result<u16, BackendError> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| BackendError::Provider(format!("cannot reserve a loopback port: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| BackendError::Provider(format!("cannot read the reserved port: {e}")))?
        .port();
    Ok(port)
}

/// Expand a command template: every `{port}` becomes `port` and every `{spillway}` becomes
/// `spillway` (the path of the running spillway binary), in any argument including the
/// program. Non-UTF-8 binary paths are kept as they are.
pub fn expand_command(template: &[String], port: u16, spillway: &Path) -> Vec<OsString> {
    let port = port.to_string();
    template
        .iter()
        .map(|arg| {
            let arg = arg.replace(PORT_PLACEHOLDER, &port);
            let mut out = OsString::new();
            for (i, piece) in arg.split(SPILLWAY_PLACEHOLDER).enumerate() {
                if i > 0 {
                    out.push(spillway.as_os_str());
                }
                out.push(piece);
            }
            out
        })
        .collect()
}

/// The base URL of a child listening on `127.0.0.1:port`.
pub fn loopback_base(port: u16) -> Uri {
    Uri::builder()
        .scheme("http")
        .authority(format!("127.0.0.1:{port}"))
        .path_and_query("/")
        .build()
        .expect("a loopback address with a u16 port is a valid authority")
}

/// A running child process that serves HTTP on `127.0.0.1:port`.
///
/// Killed when dropped (tokio `kill_on_drop`; tokio then reaps it in the background);
/// [`Self::stop`] kills and reaps it explicitly.
pub struct ChildProcess {
    child: tokio::process::Child,
    pid: u32,
    port: u16,
    base: Uri,
    program: String,
}

impl fmt::Debug for ChildProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildProcess")
            .field("pid", &self.pid)
            .field("port", &self.port)
            .field("program", &self.program)
            .finish()
    }
}

impl ChildProcess {
    /// Start `template` (expanded with [`expand_command`]) with stdin and stdout null,
    /// stderr inherited, killed on drop.
    ///
    /// # Errors
    /// [`BackendError::Spawn`] when the program cannot be started,
    /// [`BackendError::Provider`] when the template is empty.
    pub fn spawn(template: &[String], port: u16, spillway: &Path) -> Result<Self, BackendError> {
        Self::spawn_with(template, port, spillway, false)
    }

    /// [`Self::spawn`] for a VM that another gateway replica may take over
    /// (`coordination`): it outlives this process — no parent-death signal, not killed
    /// on drop, in its own process group — and whoever holds the pool stops it by its
    /// pid ([`stop_by_name`]).
    ///
    /// # Errors
    /// As [`Self::spawn`].
    pub fn spawn_detached(
        template: &[String],
        port: u16,
        spillway: &Path,
    ) -> Result<Self, BackendError> {
        Self::spawn_with(template, port, spillway, true)
    }

    fn spawn_with(
        template: &[String],
        port: u16,
        spillway: &Path,
        detached: bool,
    ) -> Result<Self, BackendError> {
        let args = expand_command(template, port, spillway);
        let Some((program, rest)) = args.split_first() else {
            return Err(BackendError::Provider("empty command".to_string()));
        };
        let program_name = program.to_string_lossy().into_owned();
        let mut command = tokio::process::Command::new(program);
        command
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(!detached);
        if detached {
            command.process_group(0);
        }
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the forked child before exec and only calls
        // prctl(2), which is async-signal-safe. It makes the kernel send SIGTERM to the
        // child when the gateway dies without cleaning up (SIGKILL, crash), so no VM or
        // function process outlives its gateway.
        if !detached {
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().map_err(|source| BackendError::Spawn {
            command: program_name.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or_default();
        tracing::debug!(pid, port, program = %program_name, "child process started");
        Ok(Self {
            child,
            pid,
            port,
            base: loopback_base(port),
            program: program_name,
        })
    }

    /// Operating-system process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The loopback port the child was told to listen on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn base(&self) -> &Uri {
        &self.base
    }

    /// `pid-PID@127.0.0.1:PORT`: the instance name used in logs and by the VM provider.
    pub fn instance_name(&self) -> String {
        format!("pid-{}@127.0.0.1:{}", self.pid, self.port)
    }

    /// The exit status if the child has exited (it is then reaped), `None` while it runs.
    /// An error querying the status counts as "still running".
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait for the child to exit on its own (cancel-safe).
    ///
    /// # Errors
    /// The I/O error of `waitpid`.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kill (SIGKILL) and reap the child. Harmless if it already exited.
    pub async fn stop(mut self) {
        if let Err(e) = self.child.kill().await {
            tracing::warn!(pid = self.pid, error = %e, "cannot kill child process");
        } else {
            tracing::debug!(pid = self.pid, port = self.port, "child process stopped");
        }
    }

    /// Send SIGKILL without waiting; pair with [`Self::stop`] to reap.
    pub fn start_kill(&mut self) {
        if let Err(e) = self.child.start_kill() {
            tracing::debug!(pid = self.pid, error = %e, "kill of a child process failed");
        }
    }
}

/// Stop the process of instance `name` (`pid-PID@127.0.0.1:PORT`, see
/// [`ChildProcess::instance_name`]) that another replica started detached: SIGTERM to
/// its pid, but only if that process still runs a command naming its port (a pid
/// reused by an unrelated process is left alone). `false`: not such a process.
pub fn stop_by_name(name: &str) -> bool {
    let Some((pid, port)) = name
        .strip_prefix("pid-")
        .and_then(|r| r.split_once("@127.0.0.1:"))
        .and_then(|(p, port)| Some((p.parse::<i32>().ok()?, port.parse::<u16>().ok()?)))
    else {
        return false;
    };
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mine = String::from_utf8_lossy(&cmdline).contains(&format!("127.0.0.1:{port}"));
    #[cfg(target_os = "linux")]
    if mine && pid > 1 {
        // SAFETY: kill(2) with a checked positive pid; no memory is touched.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, libc::SIGTERM) } == 0;
        return sent;
    }
    false
}

/// Wait until `child` answers `GET base+health_path` with a 2xx, probing every
/// `probe_interval`. Uses `tokio::time`, so it follows a paused test clock.
///
/// # Errors
/// [`BackendError::NotReady`] as soon as the child exits, or when `boot_timeout` passes
/// without a 2xx answer.
pub async fn wait_ready(
    client: &UpstreamClient,
    base: &Uri,
    health_path: &str,
    boot_timeout: Duration,
    probe_interval: Duration,
    child: &mut ChildProcess,
) -> Result<(), BackendError> {
    let instance = child.instance_name();
    let pid = child.pid;
    let probe_loop = async {
        loop {
            if client.probe(base, health_path).await {
                return;
            }
            tokio::time::sleep(probe_interval).await;
        }
    };
    let raced = async {
        tokio::select! {
            () = probe_loop => Ok(()),
            status = child.wait() => Err(match status {
                Ok(status) => format!("process exited during boot ({status})"),
                Err(e) => format!("cannot wait for the process: {e}"),
            }),
        }
    };
    match tokio::time::timeout(boot_timeout, raced).await {
        Ok(Ok(())) => {
            tracing::debug!(pid, %instance, "ready");
            Ok(())
        }
        Ok(Err(reason)) => Err(BackendError::NotReady { instance, reason }),
        Err(_) => Err(BackendError::NotReady {
            instance,
            reason: format!(
                "no 2xx answer on {health_path} within {:.3} s",
                boot_timeout.as_secs_f64()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::client::ClientSettings;

    pub(crate) fn client() -> UpstreamClient {
        UpstreamClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
        })
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn expands_port_and_spillway_anywhere() {
        let t: Vec<String> = [
            "{spillway}",
            "sample-api",
            "--listen",
            "127.0.0.1:{port}",
            "--name",
            "fn-{port}-{spillway}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = expand_command(&t, 4321, Path::new("/opt/bin/spillway"));
        let out: Vec<String> = out.into_iter().map(|s| s.into_string().unwrap()).collect();
        assert_eq!(
            out,
            [
                "/opt/bin/spillway",
                "sample-api",
                "--listen",
                "127.0.0.1:4321",
                "--name",
                "fn-4321-/opt/bin/spillway"
            ]
        );
    }

    #[test]
    fn free_port_is_nonzero_and_bindable() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind(("127.0.0.1", port)).unwrap();
        assert_eq!(
            loopback_base(port).to_string(),
            format!("http://127.0.0.1:{port}/")
        );
    }

    #[tokio::test]
    async fn spawn_of_a_missing_program_is_a_spawn_error() {
        let err = ChildProcess::spawn(&["/nonexistent/prog-{port}".into()], 1, Path::new("x"))
            .unwrap_err();
        assert!(matches!(err, BackendError::Spawn { .. }), "{err}");
        let err = ChildProcess::spawn(&[], 1, Path::new("x")).unwrap_err();
        assert!(matches!(err, BackendError::Provider(_)), "{err}");
    }

    #[tokio::test]
    async fn ready_when_the_child_answers_and_stop_reaps_it() {
        let port = free_port().unwrap();
        let template: Vec<String> = [
            "sh",
            "-c",
            "exec python3 -m http.server --bind 127.0.0.1 {port} 2>/dev/null",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut child = ChildProcess::spawn(&template, port, Path::new("spillway")).unwrap();
        let base = child.base().clone();
        wait_ready(
            &client(),
            &base,
            "/",
            Duration::from_secs(20),
            Duration::from_millis(50),
            &mut child,
        )
        .await
        .unwrap();
        assert!(client().probe(&base, "/").await);
        let pid = child.pid();
        child.stop().await;
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped"
        );
    }

    #[tokio::test]
    async fn child_exiting_during_boot_fails_fast() {
        let port = free_port().unwrap();
        let mut child = ChildProcess::spawn(&sh("exit 3 # {port}"), port, Path::new("x")).unwrap();
        let base = child.base().clone();
        let started = tokio::time::Instant::now();
        let err = wait_ready(
            &client(),
            &base,
            "/",
            Duration::from_secs(30),
            Duration::from_millis(50),
            &mut child,
        )
        .await
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not wait for the boot timeout"
        );
        match err {
            BackendError::NotReady { reason, .. } => assert!(reason.contains("exited"), "{reason}"),
            other => panic!("unexpected {other}"),
        }
    }

    #[tokio::test]
    async fn readiness_times_out_when_nothing_listens() {
        let port = free_port().unwrap();
        let mut child =
            ChildProcess::spawn(&sh("exec sleep 30 # {port}"), port, Path::new("x")).unwrap();
        let base = child.base().clone();
        let err = wait_ready(
            &client(),
            &base,
            "/",
            Duration::from_millis(400),
            Duration::from_millis(50),
            &mut child,
        )
        .await
        .unwrap_err();
        match err {
            BackendError::NotReady { reason, .. } => assert!(reason.contains("within"), "{reason}"),
            other => panic!("unexpected {other}"),
        }
        assert!(child.exited().is_none(), "still running until stopped");
        let pid = child.pid();
        child.stop().await;
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
