//! Recognising containers, pods and systemd units from a cgroup v2 path.
//!
//! Runtimes name their cgroups by convention, not by API, so this is pattern matching on path
//! components, the way cAdvisor and systemd-cgls read them:
//! - Docker: `docker-<id>.scope` (systemd driver) or `/docker/<id>` (cgroupfs driver);
//! - containerd/CRI: `cri-containerd-<id>.scope`, under Kubernetes' `kubepods*` tree;
//! - CRI-O: `crio-<id>.scope` (and `crio-conmon-<id>.scope` for its monitor);
//! - Podman/libpod: `libpod-<id>.scope` (and `libpod-conmon-<id>.scope`);
//! - Kubernetes: `kubepods[-<qos>]-pod<uid>.slice` (systemd driver, `_` for `-` in the uid) or
//!   `/kubepods/<qos>/pod<uid>/<id>` (cgroupfs driver); QoS is burstable, besteffort or
//!   guaranteed (no QoS component);
//! - systemd: the innermost `*.service` or `*.scope` unit, and `user-<uid>.slice`.

use serde::{Deserialize, Serialize};

/// What a cgroup path says about the workload in it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// `docker`, `containerd`, `cri-o`, `podman`, or absent outside containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The container id, shortened to 12 hex digits as `docker ps` shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Kubernetes pod uid (with dashes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// The innermost systemd unit (`nginx.service`, `docker-<id>.scope`, `session-3.scope`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl ContainerInfo {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// A short label for tables: `docker:0123456789ab`, `pod 1a2b…`, `nginx.service`.
    pub fn label(&self) -> String {
        match (&self.runtime, &self.id, &self.pod_uid, &self.unit) {
            (Some(runtime), Some(id), _, _) => format!("{runtime}:{id}"),
            (_, _, Some(pod), _) => format!("pod:{pod}"),
            (_, _, _, Some(unit)) => unit.clone(),
            _ => String::new(),
        }
    }
}

/// What the cgroup at `path` says about its workload, where it says anything (`None` for a
/// cgroup whose path is not known).
pub fn describe_cgroup(path: Option<&str>) -> Option<ContainerInfo> {
    path.map(describe).filter(|info| !info.is_empty())
}

/// Reads container, pod and unit from a cgroup path such as
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/cri-containerd-ab….scope`.
pub fn describe(path: &str) -> ContainerInfo {
    let mut info = ContainerInfo::default();
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (index, component) in components.iter().enumerate() {
        if let Some(unit) = component.strip_suffix(".service").map(|_| *component) {
            info.unit = Some(unit.to_owned());
        }
        if component.ends_with(".scope") {
            info.unit = Some((*component).to_owned());
        }
        if let Some(rest) = component.strip_prefix("kubepods") {
            parse_kubepods(rest, &mut info);
            continue;
        }
        if let Some(uid) = component
            .strip_prefix("pod")
            .filter(|uid| looks_like_uid(uid))
        {
            // cgroupfs driver: /kubepods/<qos>/pod<uid>/<container id>
            info.pod_uid = Some(uid.to_owned());
            continue;
        }
        for (prefix, runtime) in [
            ("docker-", "docker"),
            ("cri-containerd-", "containerd"),
            ("crio-conmon-", "cri-o"),
            ("crio-", "cri-o"),
            ("libpod-conmon-", "podman"),
            ("libpod-", "podman"),
        ] {
            if let Some(id) = component
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(".scope"))
                .filter(|id| is_container_id(id))
            {
                info.runtime = Some(runtime.to_owned());
                info.id = Some(id[..12].to_owned());
            }
        }
        // cgroupfs drivers: /docker/<id>, /kubepods/.../pod<uid>/<id>.
        if is_container_id(component) && info.id.is_none() {
            let parent = index.checked_sub(1).map(|i| components[i]).unwrap_or("");
            if parent == "docker" {
                info.runtime = Some("docker".to_owned());
                info.id = Some(component[..12].to_owned());
            } else if info.pod_uid.is_some() {
                info.id = Some(component[..12].to_owned());
            }
        }
    }
    info
}

/// The part of a `kubepods…` component after `kubepods`: `.slice`, `-burstable.slice`,
/// `-burstable-pod<uid>.slice`, `-pod<uid>.slice`, or empty (cgroupfs: QoS is the next component).
fn parse_kubepods(rest: &str, info: &mut ContainerInfo) {
    let rest = rest.strip_suffix(".slice").unwrap_or(rest);
    let mut qos = None;
    let mut remainder = rest.strip_prefix('-').unwrap_or(rest);
    for class in ["burstable", "besteffort"] {
        if let Some(after) = remainder.strip_prefix(class) {
            qos = Some(class);
            remainder = after.strip_prefix('-').unwrap_or(after);
        }
    }
    if let Some(uid) = remainder.strip_prefix("pod") {
        info.pod_uid = Some(uid.replace('_', "-"));
        info.qos = Some(qos.unwrap_or("guaranteed").to_owned());
    } else if let Some(class) = qos {
        info.qos = Some(class.to_owned());
    }
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn looks_like_uid(text: &str) -> bool {
    text.len() >= 32
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "5f1c2a3b-1111-2222-3333-444455556666";

    fn info(
        runtime: Option<&str>,
        id: Option<&str>,
        pod: Option<&str>,
        qos: Option<&str>,
        unit: Option<&str>,
    ) -> ContainerInfo {
        ContainerInfo {
            runtime: runtime.map(str::to_owned),
            id: id.map(str::to_owned),
            pod_uid: pod.map(str::to_owned),
            qos: qos.map(str::to_owned),
            unit: unit.map(str::to_owned),
        }
    }

    #[test]
    fn docker_both_drivers() {
        let scope = format!("docker-{ID}.scope");
        assert_eq!(
            describe(&format!("/system.slice/{scope}")),
            info(
                Some("docker"),
                Some("0123456789ab"),
                None,
                None,
                Some(&scope)
            )
        );
        assert_eq!(
            describe(&format!("/docker/{ID}")),
            info(Some("docker"), Some("0123456789ab"), None, None, None)
        );
    }

    #[test]
    fn kubernetes_containerd_systemd_driver() {
        let pod = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            describe(&path),
            info(
                Some("containerd"),
                Some("0123456789ab"),
                Some(UID),
                Some("burstable"),
                Some(&format!("cri-containerd-{ID}.scope"))
            )
        );
        let guaranteed = format!("/kubepods.slice/kubepods-pod{pod}.slice/crio-{ID}.scope");
        let described = describe(&guaranteed);
        assert_eq!(described.qos.as_deref(), Some("guaranteed"));
        assert_eq!(described.runtime.as_deref(), Some("cri-o"));
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let path = format!("/kubepods/besteffort/pod{UID}/{ID}");
        let described = describe(&path);
        assert_eq!(described.pod_uid.as_deref(), Some(UID));
        assert_eq!(described.id.as_deref(), Some("0123456789ab"));
    }

    #[test]
    fn podman_and_systemd_units() {
        let described = describe(&format!("/machine.slice/libpod-{ID}.scope/container"));
        assert_eq!(described.runtime.as_deref(), Some("podman"));
        assert_eq!(
            describe("/system.slice/nginx.service").unit.as_deref(),
            Some("nginx.service")
        );
        assert_eq!(
            describe("/user.slice/user-1000.slice/session-3.scope")
                .unit
                .as_deref(),
            Some("session-3.scope")
        );
        assert!(describe("/").is_empty());
        assert!(describe("/topdown-test/a").is_empty());
    }
}
