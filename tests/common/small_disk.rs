//! A small file system for one test, to fill a disk by real means: a
//! tmpfs of a few MiB mounted on a directory (root only: CI runs the
//! suite as root; elsewhere the test fails saying so), filled by one file
//! until the kernel answers `No space left on device`, and freed again.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A tmpfs mounted at [`SmallDisk::path`], unmounted when dropped.
pub struct SmallDisk {
    pub path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB at `path` (created when missing).
    pub fn mount(path: &Path, mib: u32) -> SmallDisk {
        std::fs::create_dir_all(path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(path)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "cannot mount a {mib} MiB tmpfs at {} (the full-disk test needs root, as CI runs it): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    /// Takes every free byte: the next write that needs space fails
    /// with ENOSPC.
    pub fn fill(&self) {
        let mut f = std::fs::File::create(self.filler()).unwrap();
        for chunk in [1 << 20, 4096, 1] {
            let block = vec![0u8; chunk];
            loop {
                match f.write_all(&block) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(28) => break,
                    Err(e) => panic!("filling {}: {e}", self.path.display()),
                }
            }
        }
        let _ = f.sync_all();
    }

    /// Gives the space back.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .output();
    }
}
