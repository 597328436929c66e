//! The gateway's private runtime directory: upgrade socket and pid file.
//!
//! A graceful upgrade hands the listening sockets to whoever answers on
//! the upgrade socket. In a shared temporary directory another local user
//! could create that path first and receive them, so the socket lives in
//! `gateway.runtime_dir` instead: created with mode 0700 when missing, and
//! refused when it is a symbolic link (whoever can replace the link decides
//! where the socket goes), owned by another user or writable by everyone.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Where the gateway listening on `port` keeps its runtime files. The port
/// is in the names so several gateways can share one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePaths {
    pub pid_file: PathBuf,
    pub upgrade_sock: PathBuf,
}

impl RuntimePaths {
    pub fn new(dir: &Path, port: u16) -> Self {
        Self {
            pid_file: dir.join(format!("flashgate-{port}.pid")),
            upgrade_sock: dir.join(format!("flashgate-{port}-upgrade.sock")),
        }
    }
}

/// Why the runtime directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("gateway.runtime_dir: cannot create {dir}: {source}")]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("gateway.runtime_dir: {dir} is not a directory")]
    NotADirectory { dir: PathBuf },
    #[error("gateway.runtime_dir: {dir} is a symbolic link; name the directory itself")]
    Symlink { dir: PathBuf },
    #[error("gateway.runtime_dir: {dir} is not valid UTF-8")]
    NotUtf8 { dir: PathBuf },
    #[error("gateway.runtime_dir: {dir} is owned by uid {owner}, not by this user (uid {me})")]
    OtherOwner { dir: PathBuf, owner: u32, me: u32 },
    #[error("gateway.runtime_dir: {dir} is writable by its group or by everyone (mode {mode:o}); use a private directory")]
    WorldWritable { dir: PathBuf, mode: u32 },
}

/// Creates `dir` (mode 0700) if missing and checks that it is private.
///
/// # Errors
/// When it cannot be created, is not a directory, is a symbolic link,
/// belongs to another user, is world-writable or is not UTF-8 (the server
/// takes its socket and pid paths as strings, so a lossy conversion would
/// name another path); each names `gateway.runtime_dir`.
pub fn prepare(dir: &Path) -> Result<(), RuntimeDirError> {
    // Without its trailing slash: `dir/` would make the checks below follow
    // a symbolic link named `dir`.
    let dir: PathBuf = dir.components().collect();
    let dir = dir.as_path();
    if dir.to_str().is_none() {
        return Err(RuntimeDirError::NotUtf8 {
            dir: dir.to_owned(),
        });
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| RuntimeDirError::Create {
            dir: dir.to_owned(),
            source,
        })?;
    // Not followed: the checks below must be about the directory itself.
    let meta = std::fs::symlink_metadata(dir).map_err(|source| RuntimeDirError::Create {
        dir: dir.to_owned(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(RuntimeDirError::Symlink {
            dir: dir.to_owned(),
        });
    }
    if !meta.is_dir() {
        return Err(RuntimeDirError::NotADirectory {
            dir: dir.to_owned(),
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(RuntimeDirError::OtherOwner {
            dir: dir.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(RuntimeDirError::WorldWritable {
            dir: dir.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "fg-rt-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn the_paths_derive_from_the_directory_and_the_port() {
        let p = RuntimePaths::new(Path::new("/run/flashgate"), 8080);
        assert_eq!(
            p.pid_file,
            PathBuf::from("/run/flashgate/flashgate-8080.pid")
        );
        assert_eq!(
            p.upgrade_sock,
            PathBuf::from("/run/flashgate/flashgate-8080-upgrade.sock")
        );
    }

    #[test]
    fn a_missing_directory_is_created_private() {
        let dir = scratch("new").join("run");
        prepare(&dir).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        prepare(&dir).unwrap();
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_symlink_named_with_a_trailing_slash_or_a_group_writable_directory_is_refused() {
        let target = scratch("target");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = scratch("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let with_slash = PathBuf::from(format!("{}/", link.display()));
        let err = prepare(&with_slash).unwrap_err();
        assert!(matches!(err, RuntimeDirError::Symlink { .. }), "{err}");

        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = prepare(&target).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::WorldWritable { .. }),
            "{err}"
        );
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }

    #[test]
    fn a_world_writable_directory_is_refused() {
        let dir = scratch("open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = prepare(&dir).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::WorldWritable { .. }),
            "{err}"
        );
        assert!(err.to_string().starts_with("gateway.runtime_dir"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let me = nix::unistd::geteuid();
        let dir = if me.is_root() {
            // Root can hand a scratch directory to `nobody`.
            let dir = scratch("theirs");
            std::fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(65_534), Some(65_534)).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            dir
        } else {
            PathBuf::from("/")
        };
        let err = prepare(&dir).unwrap_err();
        assert!(matches!(err, RuntimeDirError::OtherOwner { .. }), "{err}");
        if me.is_root() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_symlink_to_a_private_directory_is_refused() {
        let base = scratch("link");
        let target = base.join("real");
        prepare(&target).unwrap();
        let link = base.join("run");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = prepare(&link).unwrap_err();
        assert!(matches!(err, RuntimeDirError::Symlink { .. }), "{err}");
        assert!(err.to_string().starts_with("gateway.runtime_dir"), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_non_utf8_directory_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let dir = scratch("utf8").join(std::ffi::OsStr::from_bytes(b"run\xff"));
        let err = prepare(&dir).unwrap_err();
        assert!(matches!(err, RuntimeDirError::NotUtf8 { .. }), "{err}");
        assert!(!dir.exists());
    }

    #[test]
    fn a_file_is_not_a_runtime_directory() {
        let dir = scratch("file");
        std::fs::write(&dir, b"").unwrap();
        assert!(prepare(&dir).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
