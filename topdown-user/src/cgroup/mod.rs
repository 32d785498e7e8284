//! cgroup v2: where the hierarchy is mounted, which path a cgroup id names, and which ids `-G`
//! selects.
//!
//! The BPF side only sees cgroup ids (`bpf_get_current_cgroup_id`, the kernfs node id, which on
//! 64-bit kernels is the cgroup directory's inode number). Paths are found by walking the
//! mounted hierarchy and remembered the first time, so a cgroup removed during the run is still
//! named in the report.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::{
    error::{Failure, fail},
    session::tracefs::unescape_mount_path,
};

pub mod container;

/// The cgroup v2 mount point, from `/proc/self/mountinfo` (these machines mount it at
/// `/sys/fs/cgroup/unified`, beside v1 controllers: never assume `/sys/fs/cgroup`).
pub fn find_v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // mount-id parent-id major:minor root mount-point options [optional...] - fstype source super
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        let mount_point = before.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount_path(mount_point)))
    })
}

/// Every process under `proc_root` (`/proc`) with the id of its cgroup v2 (the inode of its
/// directory under `mount`). Processes that exit while this reads, or whose cgroup is gone,
/// are left out.
pub fn process_cgroup_ids(proc_root: &Path, mount: &Path) -> Vec<(u32, u64)> {
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(text) = fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        // cgroup(7): the v2 line is "0::PATH"; v1 lines name their controllers.
        let Some(path) = text.lines().find_map(|line| line.strip_prefix("0::")) else {
            continue;
        };
        if let Ok(meta) = fs::metadata(mount.join(path.trim_start_matches('/'))) {
            ids.push((pid, meta.ino()));
        }
    }
    ids
}

/// Maps cgroup ids to paths (relative to the v2 root, `/` for the root itself).
#[derive(Debug)]
pub struct CgroupTree {
    mount: PathBuf,
    paths: HashMap<u64, String>,
}

impl CgroupTree {
    /// Finds the v2 hierarchy of this machine; a v1-only host is a clear error.
    pub fn open() -> Result<Self> {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
        Self::from_mountinfo(&mountinfo)
    }

    /// The hierarchy a mountinfo text describes.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Self> {
        let mount = find_v2_mount(mountinfo).ok_or_else(|| {
            fail(
                Failure::Usage,
                "no cgroup v2 hierarchy is mounted (cgroup v1 only): per-cgroup breakdowns need \
                 cgroup v2; mount it with `mount -t cgroup2 none /sys/fs/cgroup/unified`",
            )
        })?;
        Ok(Self::at(mount))
    }

    /// A hierarchy mounted at `mount` (tests).
    pub fn at(mount: PathBuf) -> Self {
        let mut tree = Self {
            mount,
            paths: HashMap::new(),
        };
        tree.rescan();
        tree
    }

    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// Walks the hierarchy and remembers every cgroup's path (never forgets one).
    pub fn rescan(&mut self) {
        let mut pending = vec![(self.mount.clone(), String::from("/"))];
        while let Some((dir, relative)) = pending.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            self.paths
                .entry(meta.ino())
                .or_insert_with(|| relative.clone());
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let child = if relative == "/" {
                        format!("/{name}")
                    } else {
                        format!("{relative}/{name}")
                    };
                    pending.push((entry.path(), child));
                }
            }
        }
    }

    /// The path of `id`, rescanning once if it is new.
    pub fn path_of(&mut self, id: u64) -> Option<String> {
        if !self.paths.contains_key(&id) {
            self.rescan();
        }
        self.paths.get(&id).cloned()
    }

    /// Every id -> path learned so far.
    pub fn known_paths(&self) -> impl Iterator<Item = (u64, String)> + '_ {
        self.paths.iter().map(|(id, path)| (*id, path.clone()))
    }

    /// The ids of `-G` paths (relative to the v2 root, or absolute under its mount point).
    pub fn resolve(&mut self, paths: &[String]) -> Result<Vec<u64>> {
        paths
            .iter()
            .map(|path| {
                let relative = Path::new(path)
                    .strip_prefix(&self.mount)
                    .map(|rest| format!("/{}", rest.display()))
                    .unwrap_or_else(|_| format!("/{}", path.trim_start_matches('/')));
                let relative = if relative.len() > 1 { relative.trim_end_matches('/').to_owned() } else { relative };
                let dir = self.mount.join(relative.trim_start_matches('/'));
                let meta = fs::metadata(&dir).map_err(|_| {
                    fail(
                        Failure::Usage,
                        format!(
                            "-G {path}: no such cgroup ({} does not exist); give a path relative to \
                             the cgroup v2 root or under {}",
                            dir.display(),
                            self.mount.display()
                        ),
                    )
                })?;
                self.paths.entry(meta.ino()).or_insert(relative);
                Ok(meta.ino())
            })
            .collect()
    }
}

/// Depth of a cgroup path: `/` is 0, `/a` is 1, `/a/b` is 2.
pub fn depth(path: &str) -> usize {
    path.split('/').filter(|c| !c.is_empty()).count()
}

/// The ancestor of `path` at `depth` (the path itself if it is not deeper).
pub fn ancestor_at(path: &str, depth: usize) -> String {
    let components: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .take(depth)
        .collect();
    format!("/{}", components.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v2_mount_among_v1_controllers() {
        let mountinfo = "\
35 24 0:30 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 35 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
45 35 0:40 / /sys/fs/cgroup/unified rw,relatime shared:18 - cgroup2 cgroup2 rw
";
        assert_eq!(
            find_v2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            find_v2_mount("36 35 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            None
        );
    }

    #[test]
    fn depth_and_ancestors() {
        assert_eq!(depth("/"), 0);
        assert_eq!(depth("/a/b/c"), 3);
        assert_eq!(ancestor_at("/a/b/c", 2), "/a/b");
        assert_eq!(ancestor_at("/a", 2), "/a");
        assert_eq!(ancestor_at("/a/b", 0), "/");
    }

    #[test]
    fn paths_of_a_directory_tree_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        let mut tree = CgroupTree::at(dir.path().to_path_buf());
        let id = fs::metadata(dir.path().join("a/b")).unwrap().ino();
        assert_eq!(tree.path_of(id).as_deref(), Some("/a/b"));
        assert_eq!(
            tree.resolve(&["a".into()]).unwrap(),
            vec![fs::metadata(dir.path().join("a")).unwrap().ino()]
        );
        let absolute = dir.path().join("a/b").display().to_string();
        assert_eq!(tree.resolve(&[absolute]).unwrap(), vec![id]);
        let err = tree.resolve(&["nope".into()]).unwrap_err();
        assert!(err.to_string().contains("-G nope: no such cgroup"));
        // A removed cgroup keeps its name.
        fs::remove_dir(dir.path().join("a/b")).unwrap();
        tree.rescan();
        assert_eq!(tree.path_of(id).as_deref(), Some("/a/b"));
    }

    #[test]
    fn each_process_gets_the_inode_of_its_v2_cgroup() {
        let root =
            std::env::temp_dir().join(format!("topdown-proc-cgroups-{}", std::process::id()));
        let proc_root = root.join("proc");
        let mount = root.join("unified");
        fs::create_dir_all(mount.join("system.slice/app.service")).unwrap();
        for (pid, cgroup) in [
            ("10", "12:cpu:/x\n0::/system.slice/app.service\n"),
            ("11", "0::/\n"),
            // A cgroup removed meanwhile, and a v1-only process: left out.
            ("12", "0::/gone\n"),
            ("13", "3:memory:/\n"),
            ("self", "0::/\n"),
        ] {
            fs::create_dir_all(proc_root.join(pid)).unwrap();
            fs::write(proc_root.join(pid).join("cgroup"), cgroup).unwrap();
        }
        let ino = |path: &Path| fs::metadata(path).unwrap().ino();
        let mut ids = process_cgroup_ids(&proc_root, &mount);
        ids.sort();
        assert_eq!(
            ids,
            vec![
                (10, ino(&mount.join("system.slice/app.service"))),
                (11, ino(&mount)),
            ]
        );
        let _ = fs::remove_dir_all(root);
    }
}
