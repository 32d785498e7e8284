//! `topdown top` end to end, in a real pseudo-terminal: tmux runs it (installed by `cargo
//! xtask setup`), the test reads the screen with `capture-pane`, types keys with `send-keys`,
//! and checks that leaving gives the terminal back as it was (main screen, cooked mode, echo).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use topdown_tests::*;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_td-workload");

/// One tmux server per test (its own socket), holding one 120x20 pane.
struct Pane {
    socket: String,
}

impl Pane {
    /// [`Pane::start`] of `topdown top --pmu PMU --refresh-ms REFRESH_MS ARGS`, waiting until
    /// its command has exited (status 0): the pane and its screen then.
    fn top_after_its_command(
        name: &str,
        pmu: &str,
        refresh_ms: u32,
        args: &[&str],
    ) -> (Self, String) {
        let refresh_ms = refresh_ms.to_string();
        let top = ["top", "--pmu", pmu, "--refresh-ms", &refresh_ms];
        let pane = Self::start(name, &[&top, args].concat());
        let screen = pane.wait_for("the command exited (status 0)");
        (pane, screen)
    }

    /// Runs `topdown ARGS` in a new pane. The shell around it reports topdown's exit status
    /// and the terminal's mode after it, then stays so the pane can still be read.
    fn start(name: &str, args: &[&str]) -> Self {
        let socket = format!("topdown-test-{}-{name}", std::process::id());
        let mut command = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "\"$0\" \"$@\"; echo \"topdown exited with $?\"; stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo; exec sleep 600"
                .to_owned(),
            topdown_bin().display().to_string(),
        ];
        command.extend(args.iter().map(|arg| (*arg).to_owned()));
        let status = Command::new("tmux")
            .args(["-L", &socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-x", "120", "-y", "20", "-s", "top"])
            .args(&command)
            .stdin(Stdio::null())
            .status()
            .expect("tmux is needed for this test (cargo xtask setup installs it)");
        assert!(status.success(), "tmux new-session failed: {status}");
        Self { socket }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "tmux {args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "top"])
    }

    /// The screen once it shows `text` (panics with the screen after 30 s).
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {text:?}; it shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// After topdown has exited: the pane is back on the main screen, with the cursor shown,
    /// in cooked mode with echo, and nothing of the view left on it.
    fn assert_restored(&self) {
        let screen = self.wait_for("topdown exited with 0\nicanon\necho\n");
        assert_eq!(
            self.tmux(&[
                "display-message",
                "-p",
                "-t",
                "top",
                "#{alternate_on} #{cursor_flag}"
            ]),
            "0 1\n"
        );
        assert!(!screen.contains("topdown top - model"), "{screen}");
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

/// The screen's line that contains `text`, split into words.
fn row<'a>(screen: &'a str, text: &str) -> Vec<&'a str> {
    screen
        .lines()
        .find(|line| line.contains(text))
        .unwrap_or_else(|| panic!("no line with {text:?} in:\n{screen}"))
        .split_whitespace()
        .collect()
}

#[test]
fn top_shows_the_commands_topdown_and_gives_the_terminal_back() {
    let Some(_serial) = bpf_serial() else { return };
    // Slots 1000 = retiring 400 + bad speculation 100 + frontend 200 + backend 300.
    let (pane, screen) = Pane::top_after_its_command(
        "command",
        "synthetic:intel-icl",
        5000,
        &[
            "--",
            WORKLOAD,
            "--main-thread",
            "getppid=1000,getpgid=400,getsid=100,getpriority=200,getresuid=300",
        ],
    );
    let lines: Vec<&str> = screen.lines().collect();
    assert!(
        lines[0].starts_with("topdown top - model intel-icl (SYNTHETIC) | level 1 | "),
        "{screen}"
    );
    assert!(
        lines[0].contains(" CPUs | refresh 5000 ms | overhead "),
        "{screen}"
    );
    assert_eq!(
        lines[1],
        "█ retiring  █ bad_speculation  █ frontend_bound  █ backend_bound  [processes, sort slots, PAUSED]"
    );
    assert_eq!(
        lines[2].trim_end(),
        "    PID COMM                  slots  share  Retire BadSpec   Front    Back"
    );
    let words = row(&screen, "td-workload");
    assert!(words[0].parse::<u32>().is_ok(), "{screen}");
    // The share depends on what else calls getppid on this machine: only its form is fixed.
    assert_eq!(
        [words[1], words[2], words[4], words[5], words[6], words[7]],
        ["td-workload", "1000", "40.0%", "10.0%", "20.0%", "30.0%"]
    );
    assert!(words[3].ends_with('%'), "{screen}");
    // 120 columns: 44 for the bar, full for a row whose categories sum to 100%.
    assert_eq!(words[8], "█".repeat(44));

    // Threads view, then a filter that matches nothing.
    pane.keys(&["t"]);
    let screen = pane.wait_for("[threads, sort slots, PAUSED]");
    assert_eq!(row(&screen, "td-workload")[2], "1000");
    pane.keys(&["/", "n", "o", "p", "e", "Enter"]);
    let screen = pane.wait_for("filter 'nope'");
    assert!(!screen.contains("td-workload"), "{screen}");

    pane.keys(&["q"]);
    pane.assert_restored();
}

/// The functions view's `d`: the selected function's calls by bucket, each with why. `band`
/// makes 1000 calls of 10 getppid + 10 getpgid (slots, retiring) and 30 of 1000 getppid +
/// 1000 getresuid (slots, backend bound).
#[test]
fn top_shows_the_selected_functions_distribution() {
    let Some(_serial) = bpf_serial() else { return };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("top-distribution");
    let funcs = build_c(&dir, "funcs.c", "funcs", &["-O0", "-g", "-pthread"]);
    let funcs = funcs.display().to_string();
    let probe = format!("{funcs}:band");
    let (pane, _) = Pane::top_after_its_command(
        "distribution",
        "synthetic:intel-icl",
        5000,
        &[
            "-u", &probe, "--", &funcs, "bands", "1000", "10", "30", "1000",
        ],
    );
    pane.keys(&["d"]);
    pane.wait_for(
        "d shows the selected function's or span's distribution: switch to functions with f or spans with r",
    );
    pane.keys(&["f", "Down", "d"]);
    let screen = pane.wait_for("band: inclusive slots per call");
    assert!(
        screen.contains("band: inclusive slots per call  p50 11  p90 12  p99 980"),
        "{screen}"
    );
    let fast = row(&screen, "[10, 12)");
    assert_eq!(
        [fast[2], fast[4], fast[5]],
        ["1000", "retiring", "100%"],
        "{screen}"
    );
    let slow = row(&screen, "[896, 1024)");
    assert_eq!(
        [slow[2], slow[4], slow[5]],
        ["30", "backend_bound", "100%"],
        "{screen}"
    );
    // `d` again hides it.
    pane.keys(&["d"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while pane.screen().contains("[896, 1024)") {
        assert!(Instant::now() < deadline, "{}", pane.screen());
        std::thread::sleep(Duration::from_millis(100));
    }
    pane.keys(&["q"]);
    pane.assert_restored();
}

#[test]
fn top_with_the_software_model_shows_on_cpu_time() {
    let Some(_serial) = bpf_serial() else { return };
    let (pane, screen) = Pane::top_after_its_command(
        "software",
        "software",
        500,
        &["--", WORKLOAD, "--main-thread", "spin=1500"],
    );
    assert!(
        screen.starts_with("topdown top - model software | on-CPU time (no TopDown) | "),
        "{screen}"
    );
    assert!(
        screen.contains("[processes, sort cpu-clock, PAUSED]"),
        "{screen}"
    );
    let words = row(&screen, "td-workload");
    // The whole run: 1.5 s of wall-clock spin, on CPU for at most that (and start-up), at
    // least a little even on a busy machine.
    let on_cpu: f64 = words[2].trim_end_matches("ms").parse().unwrap();
    assert!((100.0..=2000.0).contains(&on_cpu), "{screen}");
    // Ctrl-C quits as q does.
    pane.keys(&["C-c"]);
    pane.assert_restored();
}

#[test]
fn sigterm_gives_the_terminal_back() {
    let Some(_serial) = bpf_serial() else { return };
    let pane = Pane::start("sigterm", &["top", "-a", "--pmu", "synthetic:intel-icl"]);
    pane.wait_for("topdown top - model intel-icl");
    let shell = pane.tmux(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
    let shell = shell.trim();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
    let topdown: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: signalling the topdown this test started.
    assert_eq!(unsafe { libc::kill(topdown, libc::SIGTERM) }, 0);
    pane.assert_restored();
}

#[test]
fn top_refuses_a_stdout_that_is_not_a_terminal() {
    let output = topdown()
        .args(["top", "--pmu", "synthetic:intel-icl", "--", "true"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(output.stdout, b"");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "topdown: error: topdown top draws on a terminal and stdout is not one: for reports to a file or pipe use `topdown stat -I MS`\n"
    );
}
