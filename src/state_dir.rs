//! The state directory: where a gateway keeps what outlives its process — the
//! asynchronous-call store (`<state dir>/async/calls.redb`). It is needed only when a
//! route enables asynchronous calls.
//!
//! Which directory, first match wins:
//! 1. `spillway serve --state-dir DIR` (or `SPILLWAY_STATE_DIR=DIR`);
//! 2. `$STATE_DIRECTORY`, which systemd sets for a unit with `StateDirectory=spillway`
//!    (`/var/lib/spillway`; the first one when it lists several);
//! 3. `$XDG_STATE_HOME/spillway` (XDG Base Directory: an absolute path only);
//! 4. `$HOME/.local/state/spillway`.
//!
//! The directory is created with mode 0700 (it holds request bodies); one gateway at a
//! time may use it (the store is locked while open).

use std::path::{Path, PathBuf};

/// No state directory could be chosen.
#[derive(Debug, thiserror::Error)]
#[error(
    "no state directory for the asynchronous-call store: neither --state-dir \
     (SPILLWAY_STATE_DIR), STATE_DIRECTORY, XDG_STATE_HOME nor HOME is set; start with \
     --state-dir DIR"
)]
pub struct NoStateDir;

/// The state directory: `explicit` when given, else the first of the defaults in the
/// [module docs](self) that the environment `var` provides.
///
/// # Errors
/// [`NoStateDir`] when nothing gives one.
pub fn resolve(
    explicit: Option<&Path>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<PathBuf, NoStateDir> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(dirs) = set("STATE_DIRECTORY")
        && let Some(first) = dirs.split(':').find(|d| !d.is_empty())
    {
        return Ok(PathBuf::from(first));
    }
    if let Some(xdg) = set("XDG_STATE_HOME").filter(|x| Path::new(x).is_absolute()) {
        return Ok(Path::new(&xdg).join("spillway"));
    }
    if let Some(home) = set("HOME") {
        return Ok(Path::new(&home).join(".local/state/spillway"));
    }
    Err(NoStateDir)
}

/// [`resolve`] with the process environment.
///
/// # Errors
/// As [`resolve`].
pub fn from_env(explicit: Option<&Path>) -> Result<PathBuf, NoStateDir> {
    resolve(explicit, |name| std::env::var(name).ok())
}

/// Create `dir` and its parents; a directory created here gets mode 0700.
///
/// # Errors
/// The I/O error.
pub fn create(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn the_flag_then_systemd_then_xdg_then_home() {
        let all = [
            ("STATE_DIRECTORY", "/var/lib/spillway:/var/lib/other"),
            ("XDG_STATE_HOME", "/home/u/.state"),
            ("HOME", "/home/u"),
        ];
        let flag = Path::new("/srv/gw1");
        assert_eq!(resolve(Some(flag), env(&all)).unwrap(), flag);
        assert_eq!(
            resolve(None, env(&all)).unwrap(),
            Path::new("/var/lib/spillway")
        );
        assert_eq!(
            resolve(None, env(&all[1..])).unwrap(),
            Path::new("/home/u/.state/spillway")
        );
        // A relative XDG_STATE_HOME is ignored, as the XDG spec says.
        let relative = [("XDG_STATE_HOME", "state"), ("HOME", "/home/u")];
        assert_eq!(
            resolve(None, env(&relative)).unwrap(),
            Path::new("/home/u/.local/state/spillway")
        );
        let e = resolve(None, env(&[("HOME", "")])).unwrap_err();
        assert!(e.to_string().contains("--state-dir DIR"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_created_state_directory_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b");
        create(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        create(&dir).unwrap();
    }
}
