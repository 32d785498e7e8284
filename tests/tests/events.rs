//! `topdown list -e`: encodings printed without counting (needs libpfm4 for libpfm names; no
//! privileges, no PMU).

use topdown_tests::{temp_path, topdown, usage_error};

fn list_json(specs: &[&str]) -> serde_json::Value {
    let mut command = topdown();
    command.arg("list");
    for spec in specs {
        command.args(["-e", spec]);
    }
    let output = command.args(["--format", "json"]).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The acceptance line. Expected words from Intel's Knights Landing event list
/// (perfmon knightslanding_core.json: OFFCORE_RESPONSE.ANY_REQUEST.DDR_NEAR is event 0xB7
/// umask 0x01 with MSRValue 0x0080808000), the PMU not present on this machine.
#[test]
fn knl_offcore_response_encodes_on_any_machine() {
    let list = list_json(&["knl::OFFCORE_RESPONSE_0:ANY_REQUEST:DDR_NEAR"]);
    let event = &list[0];
    assert_eq!(event["pmu"], "knl");
    assert_eq!(event["syntax"], "libpfm");
    assert_eq!(event["type"], 4);
    assert_eq!(event["config"], "0x1b7");
    assert_eq!(event["config1"], "0x80808000");
    assert_eq!(event["config2"], "0x0");
    assert_eq!(event["exclude"], serde_json::Value::Null);
    assert_eq!(
        event["fstr"],
        "knl::OFFCORE_RESPONSE_0:ANY_REQUEST:DDR_NEAR:e=0:i=0:c=0:u=1:k=1:mg=0:mh=1"
    );
}

#[test]
fn perf_syntax_and_the_model_in_use() {
    let list = list_json(&["cycles:u", "sched:sched_switch"]);
    assert_eq!(list[0]["syntax"], "perf");
    assert_eq!(list[0]["fstr"], serde_json::Value::Null);
    assert_eq!(
        (list[0]["type"].clone(), list[0]["config"].clone()),
        (0.into(), "0x0".into())
    );
    assert_eq!(list[0]["exclude"]["kernel"], true);
    assert_eq!(list[0]["exclude"]["user"], false);
    assert_eq!(list[1]["tracepoint"], "sched:sched_switch");
    // --pmu picks libpfm's PMU: UOPS_ISSUED.ANY is 0x0E/0x01 on Skylake and 0xAE/0x01 on
    // Sapphire Rapids (Intel perfmon skylake_core.json, sapphirerapids_core.json).
    for (model, pmu, config) in [("intel-skl", "skl", "0x10e"), ("intel-spr", "spr", "0x1ae")] {
        let output = topdown()
            .args([
                "list",
                "--pmu",
                model,
                "-e",
                "UOPS_ISSUED:ANY:u",
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        let list: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(list[0]["pmu"], pmu, "{model}");
        assert_eq!(list[0]["config"], config, "{model}");
        assert_eq!(list[0]["exclude"]["kernel"], true, "{model}");
    }
}

#[test]
fn an_illegal_combination_is_one_line_and_a_usage_error() {
    let output = topdown()
        .args([
            "list",
            "-e",
            "knl::OFFCORE_RESPONSE_0:ANY_RFO:DDR_NEAR:ANY_RESPONSE",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "event 'knl::OFFCORE_RESPONSE_0:ANY_RFO:DDR_NEAR:ANY_RESPONSE': libpfm4: invalid \
             combination of model specific features"
        ),
        "{stderr}"
    );
}

#[test]
fn the_table_reads_like_check_events() {
    let output = topdown()
        .args(["list", "-e", "knl::UNHALTED_CORE_CYCLES:t:u"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for line in [
        "Requested event: knl::UNHALTED_CORE_CYCLES:t:u",
        "Actual event:    knl::UNHALTED_CORE_CYCLES:e=0:i=0:c=0:t=1:u=1:k=0:mg=0:mh=1",
        "PMU:             knl",
        "config:          0x20003c",
        "exclude:         user=0 kernel=1 hv=0 host=0 guest=0 idle=0",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// Without libpfm.so.4 the binary still runs: libpfm-style names fail with one line naming the
/// `libpfm4` package (exit 2), perf syntax keeps working. The library is hidden by
/// bind-mounting an empty file over it in a private mount namespace, so dlopen really fails.
#[test]
fn without_libpfm_names_fail_in_one_line_and_perf_syntax_works() {
    if !topdown_tests::privileged() {
        return;
    }
    let library = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
    ]
    .iter()
    .map(|dir| std::path::Path::new(dir).join("libpfm.so.4"))
    .find(|path| path.exists())
    .expect("libpfm.so.4 is installed by `cargo xtask setup`");
    let library = std::fs::canonicalize(library).unwrap();
    let empty = temp_path("no-libpfm");
    std::fs::write(&empty, b"").unwrap();
    let bin = topdown_tests::topdown_bin();
    let script = format!(
        "mount --bind '{}' '{}' || exit 99; \
         '{bin}' list -e 'knl::OFFCORE_RESPONSE_0:ANY_REQUEST' 2>&1; echo \"rc=$?\"; \
         '{bin}' list -e cpu-clock --format json 2>&1; echo \"rc=$?\"",
        empty.display(),
        library.display(),
        bin = bin.display()
    );
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&empty);
    let text = String::from_utf8_lossy(&output.stdout);
    let mut parts = text.split("rc=");
    let refused = parts.next().unwrap_or_default();
    assert_eq!(
        refused.trim(),
        "topdown: error: -e event 'knl::OFFCORE_RESPONSE_0:ANY_REQUEST': libpfm-style event \
         names need libpfm4 (libpfm.so.4): install the `libpfm4` package, or use perf syntax \
         (cpu/event=0x..,umask=0x../, rNNNN, or the PMU's named events from `topdown list`)",
        "{text}"
    );
    let rest = parts.next().unwrap_or_default();
    assert!(
        rest.starts_with('2'),
        "libpfm name: exit 2 expected:\n{text}"
    );
    let perf = rest
        .split_once('\n')
        .map(|(_, json)| json)
        .unwrap_or_default();
    assert!(perf.contains("\"syntax\": \"perf\""), "{text}");
    assert!(parts.next().is_some_and(|rc| rc.starts_with('0')), "{text}");
}

/// PMUs libpfm4 4.13 lacks (Granite Rapids, Zen 5, every Arm PMU in an x86 build) still take
/// the names of the events topdown's own models open. Expected words from the vendors' lists:
/// Intel perfmon graniterapids_core.json TOPDOWN.SLOTS (event 0x00, umask 0x04), Arm Neoverse N2
/// TRM STALL_SLOT (0x3F), AMD family 1Ah PPR PMCx0C1 Retired Ops (perf's ex_ret_ops).
#[test]
fn names_of_pmus_libpfm_lacks_come_from_the_model_tables() {
    let list = list_json(&["gnr::TOPDOWN:SLOTS", "arm_n2::STALL_SLOT:u"]);
    assert_eq!(list[0]["pmu"], "intel-spr (topdown's table)");
    assert_eq!(
        (list[0]["type"].clone(), list[0]["config"].clone()),
        (4.into(), "0x400".into())
    );
    assert_eq!(list[1]["config"], "0x3f");
    assert_eq!(list[1]["exclude"]["kernel"], true);
    assert_eq!(list[1]["exclude"]["user"], false);
    let output = topdown()
        .args([
            "list",
            "--pmu",
            "amd-zen5",
            "-e",
            "ex_ret_ops",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let zen5: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(zen5[0]["config"], "0xc1", "{zen5}");
    // Anything else still needs a libpfm4 that has the PMU: one line, exit 2.
    let stderr = usage_error(topdown().args(["list", "-e", "gnr::MEM_LOAD_RETIRED:L3_MISS"]));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("not among the events topdown's intel-spr model opens"),
        "{stderr}"
    );
}
