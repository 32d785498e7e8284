//! Two regions with different bottlenecks, measured by the program itself (the Rust twin of
//! `regions.c`): "pointer_chase" walks a random cycle through 32 MiB (memory bound), "branchy"
//! adds up random data above a threshold (bad speculation).
//!
//! `TOPDOWN_REGION_MODEL=intel-icl cargo run --release -p topdown-region --example regions -- out.json`
//! (default model: software), then `topdown report -i out.json --by function`.

const CHASE_ELEMENTS: usize = 4 << 20;
const CHASE_STEPS: usize = 2 << 20;
const BRANCH_ELEMENTS: usize = 4 << 20;

/// xorshift64: a fixed, cheap sequence, the same on every run.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn pointer_chase(next: &[usize], steps: usize) -> usize {
    let mut at = 0;
    for _ in 0..steps {
        at = next[at];
    }
    at
}

fn branchy(data: &[u32]) -> u64 {
    let mut sum = 0u64;
    for &value in data {
        if value & 0x8000_0000 != 0 {
            sum += u64::from(value);
            // Keeps this a branch: without it the compiler turns the `if` into a conditional
            // move (or vector code), and nothing is left to mispredict.
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
    sum
}

fn main() -> std::process::ExitCode {
    match topdown_region::Config::from_env().and_then(topdown_region::init) {
        Ok(()) => {}
        Err(err) => eprintln!("regions: no counters: {err}"),
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    // A single random cycle through every element (Sattolo's shuffle).
    let mut next: Vec<usize> = (0..CHASE_ELEMENTS).collect();
    for i in (1..CHASE_ELEMENTS).rev() {
        let j = (next_random(&mut state) % i as u64) as usize;
        next.swap(i, j);
    }
    let data: Vec<u32> = (0..BRANCH_ELEMENTS)
        .map(|_| next_random(&mut state) as u32)
        .collect();

    let (mut end, mut sum) = (0, 0);
    for _ in 0..3 {
        {
            let _region = topdown_region::region("pointer_chase");
            end += std::hint::black_box(pointer_chase(&next, CHASE_STEPS));
        }
        {
            let _region = topdown_region::region("branchy");
            sum += std::hint::black_box(branchy(&data));
        }
    }
    println!("regions: chase ended at {end}, sum {sum}");
    let (path, reason) = topdown_region::thread_path();
    println!("regions: counters read by {}: {reason}", path.name());
    let snapshot = topdown_region::snapshot();
    eprint!("{}", topdown_region::report::summary(&snapshot));
    if let Some(out) = std::env::args_os().nth(1)
        && let Err(err) = topdown_region::report::write_json(&snapshot, out.as_ref())
    {
        eprintln!("regions: {err}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
