//! The cost of one region begin/end pair on this machine: `pair_cost [PAIRS]` prints
//! `ns_per_pair=X path=P` for the model of `TOPDOWN_REGION_MODEL` (default software).
//! docs/regions.md, "Regions or `-u`? Cost", quotes it (release build).

fn main() {
    let pairs: u32 = std::env::args()
        .nth(1)
        .and_then(|text| text.parse().ok())
        .unwrap_or(100_000);
    if let Err(err) = topdown_region::Config::from_env().and_then(topdown_region::init) {
        eprintln!("pair_cost: no counters: {err}");
    }
    // The first region opens the thread's counters: not part of the per-pair cost.
    drop(topdown_region::region("pair"));
    let start = std::time::Instant::now();
    for _ in 0..pairs {
        topdown_region::begin("pair");
        topdown_region::end("pair");
    }
    let elapsed = start.elapsed();
    let (path, _) = topdown_region::thread_path();
    println!(
        "ns_per_pair={:.1} path={}",
        elapsed.as_nanos() as f64 / f64::from(pairs),
        path.name()
    );
}
