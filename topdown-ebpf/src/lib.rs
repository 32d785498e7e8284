// Present so that topdown-user can name this crate as a build-dependency (cargo then rebuilds
// the eBPF object when its sources change). The programs are in main.rs.
#![no_std]
