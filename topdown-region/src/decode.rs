//! Decoding Intel's PERF_METRICS register read with rdpmc, and the multiplexing check.
//!
//! Source: perf-topdown.txt (linux tools/perf/Documentation/topdown.txt), sections "Decoding
//! metrics values", "Resetting metrics counters" and "Extension on Sapphire Rapids Server";
//! the kernel's `icl_get_metrics_event_value` as summarised in topdown-formulas.md §1.2.

/// Bytes of PERF_METRICS: 0-3 the level-1 fractions, 4-7 the level-2 ones (Sapphire Rapids
/// and later), each a fraction of 0xff (perf-topdown.txt "Decoding metrics values").
pub const L1_FIELDS: [&str; 4] = [
    "topdown-retiring",
    "topdown-bad-spec",
    "topdown-fe-bound",
    "topdown-be-bound",
];
pub const L2_FIELDS: [&str; 4] = [
    "topdown-heavy-ops",
    "topdown-br-mispredict",
    "topdown-fetch-lat",
    "topdown-mem-bound",
];

/// The raw `config` of fixed counter 3, SLOTS (perf-topdown.txt: event=0x00, umask=0x04).
pub const SLOTS_CONFIG: u64 = 0x0400;

/// The PERF_METRICS byte a metric pseudo-event (`event=0x00, umask=0x8X`, raw config
/// `0x8X00`) stands for, or `None` for any other config.
pub fn metric_field(config: u64) -> Option<usize> {
    let umask = (config >> 8) & 0xff;
    (config & !0xff00 == 0 && (0x80..=0x87).contains(&umask)).then(|| (umask - 0x80) as usize)
}

/// `GET_METRIC(m, i)`: byte `i` of the metrics register.
pub fn metric_byte(metrics: u64, field: usize) -> u8 {
    ((metrics >> (field * 8)) & 0xff) as u8
}

/// `TOPDOWN_RETIRING(val)` and friends: byte `field` as a fraction of 0xff.
pub fn metric_fraction(metrics: u64, field: usize) -> f64 {
    f64::from(metric_byte(metrics, field)) / 255.0
}

/// The slots byte `field` stands for: `slots * byte / 0xff`, floored, as the kernel's
/// `icl_get_metrics_event_value` (`mul_u64_u32_div(slots, byte, 0xff)`) makes the count a
/// `read()` of the metric event returns (topdown-formulas.md §1.2). So a region's counts are the
/// same numbers on the rdpmc and the read() paths, and the model's formulas take both.
///
/// The seed's pseudo-code scales by the byte alone (`GET_METRIC(metric_b, 0) * slots_b`) and
/// divides by 0xff only in its ratio macros; dividing here keeps the unit "slots".
pub fn scaled_slots(metrics: u64, field: usize, slots: u64) -> u64 {
    let scaled = u128::from(slots) * u128::from(metric_byte(metrics, field)) / 255;
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// One rdpmc reading of SLOTS and PERF_METRICS, taken together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsReading {
    pub slots: u64,
    pub metrics: u64,
}

/// Slot counts and fractions over the period between two readings of one measurement period
/// (no reset between them).
#[derive(Clone, Debug, PartialEq)]
pub struct PeriodMetrics {
    pub slots: u64,
    /// Slot-scaled counts of the four level-1 bytes, then the four level-2 bytes.
    pub scaled: [u64; 8],
}

/// The seed's "compute delta scaled metrics between b and a": each byte times its slots at
/// `b` minus the same at `a`. A byte's share can shrink between readings while its slots
/// grow slower than the other fields' (the kernel guards the same case in
/// `__icl_update_topdown_event`: "if (delta > last)"), so a negative delta is 0.
pub fn period_between(a: MetricsReading, b: MetricsReading) -> PeriodMetrics {
    let mut scaled = [0u64; 8];
    for (field, value) in scaled.iter_mut().enumerate() {
        *value = scaled_slots(b.metrics, field, b.slots)
            .saturating_sub(scaled_slots(a.metrics, field, a.slots));
    }
    PeriodMetrics {
        slots: b.slots.saturating_sub(a.slots),
        scaled,
    }
}

impl PeriodMetrics {
    /// The period's fractions of slots: level 1, then (Sapphire Rapids) level 2 with the four
    /// derived ones (perf-topdown.txt "Extension on Sapphire Rapids Server": Light_Operations =
    /// Retiring - Heavy_Operations, Machine_Clears = Bad_Speculation - Branch_Mispredicts,
    /// Fetch_Bandwidth = Frontend_Bound - Fetch_Latency, Core_Bound = Backend_Bound -
    /// Memory_Bound). `None` for an empty period.
    pub fn fractions(&self) -> Option<Fractions> {
        if self.slots == 0 {
            return None;
        }
        let ratio = |field: usize| self.scaled[field] as f64 / self.slots as f64;
        let (retiring, bad_speculation, frontend_bound, backend_bound) =
            (ratio(0), ratio(1), ratio(2), ratio(3));
        let (heavy_operations, branch_mispredicts, fetch_latency, memory_bound) =
            (ratio(4), ratio(5), ratio(6), ratio(7));
        Some(Fractions {
            retiring,
            bad_speculation,
            frontend_bound,
            backend_bound,
            heavy_operations,
            light_operations: retiring - heavy_operations,
            branch_mispredicts,
            machine_clears: bad_speculation - branch_mispredicts,
            fetch_latency,
            fetch_bandwidth: frontend_bound - fetch_latency,
            memory_bound,
            core_bound: backend_bound - memory_bound,
        })
    }
}

/// Fractions of a period's slots (level 2 meaningful on Sapphire Rapids and later only).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fractions {
    pub retiring: f64,
    pub bad_speculation: f64,
    pub frontend_bound: f64,
    pub backend_bound: f64,
    pub heavy_operations: f64,
    pub light_operations: f64,
    pub branch_mispredicts: f64,
    pub machine_clears: f64,
    pub fetch_latency: f64,
    pub fetch_bandwidth: f64,
    pub memory_bound: f64,
    pub core_bound: f64,
}

/// How long a PERF_METRICS measurement period may run before the library resets it at the
/// next outermost region begin: the 8-bit fractions lose precision as the period grows
/// (perf-topdown.txt "Resetting metrics counters": "schedule such a reset regularly, as in
/// every few seconds").
pub const RESET_PERIOD_NS: u64 = 1_000_000_000;

/// Whether a counter counted all the time it was enabled, from `time_enabled`/`time_running`
/// deltas (the page's, or a read()'s PERF_FORMAT_TOTAL_TIME_*).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coverage {
    /// Counting the whole time: the counts are exact.
    Full,
    /// On the PMU for this fraction of the time (multiplexed): counts cover only that part.
    Partial(f64),
    /// Enabled but never on the PMU (another user holds the counters): no counts at all.
    NeverRan,
    /// Not enabled during the period (nothing ran).
    Idle,
}

pub fn coverage(enabled_delta: u64, running_delta: u64) -> Coverage {
    if enabled_delta == 0 {
        Coverage::Idle
    } else if running_delta == 0 {
        Coverage::NeverRan
    } else if running_delta >= enabled_delta {
        Coverage::Full
    } else {
        Coverage::Partial(running_delta as f64 / enabled_delta as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four bytes in PERF_METRICS order (retiring lowest).
    /// The seed's Sapphire Rapids vector. Level 1: 0x66 0x33 0x33 0x33 (40/20/20/20%); level 2:
    /// heavy 0x33, br_mispredict 0x1a, fetch_lat 0x22, mem_bound 0x11.
    const SPR_METRICS: u64 = u64::from_le_bytes([0x66, 0x33, 0x33, 0x33, 0x33, 0x1a, 0x22, 0x11]);

    /// A reading of `slots` and the PERF_METRICS word `metrics`.
    fn reading(slots: u64, metrics: u64) -> MetricsReading {
        MetricsReading { slots, metrics }
    }

    fn l1(retiring: u8, bad_spec: u8, fe: u8, be: u8) -> u64 {
        u64::from_le_bytes([retiring, bad_spec, fe, be, 0, 0, 0, 0])
    }

    /// The seed's printf of "Decoding metrics values", with its ratios (which carry the
    /// seed's byte units; `fractions()` gives them in slots, i.e. divided by 0xff here).
    fn seed_printf(fractions: &Fractions) -> String {
        format!(
            "Retiring {:.2}% Bad Speculation {:.2}% FE Bound {:.2}% BE Bound {:.2}%",
            fractions.retiring * 100.,
            fractions.bad_speculation * 100.,
            fractions.frontend_bound * 100.,
            fractions.backend_bound * 100.,
        )
    }

    #[test]
    fn metric_configs_map_to_their_bytes() {
        // topdown-formulas.md §1.1: topdown-retiring 0x8000 .. topdown-mem-bound 0x8700.
        assert_eq!(metric_field(0x8000), Some(0));
        assert_eq!(metric_field(0x8300), Some(3));
        assert_eq!(metric_field(0x8700), Some(7));
        assert_eq!(metric_field(SLOTS_CONFIG), None);
        assert_eq!(metric_field(0x8800), None);
        assert_eq!(metric_field(0x1_8000), None);
        assert_eq!(metric_field(0x8001), None);
    }

    #[test]
    fn get_metric_reads_each_byte() {
        // "All four fields add up to 0xff (= 100%)": 0x40 + 0x20 + 0x50 + 0x4f = 0xff.
        let metrics = u64::from_le_bytes([0x40, 0x20, 0x50, 0x4f, 0x06, 0x07, 0x08, 0x11]);
        assert_eq!(metric_byte(metrics, 0), 0x40);
        assert_eq!(metric_byte(metrics, 3), 0x4f);
        assert_eq!(metric_byte(metrics, 4), 0x06);
        assert_eq!(metric_byte(metrics, 7), 0x11);
        let sum: u32 = (0..4).map(|i| u32::from(metric_byte(metrics, i))).sum();
        assert_eq!(sum, 0xff);
        // TOPDOWN_RETIRING(val) = 0x40 / 0xff.
        assert_eq!(format!("{:.4}", metric_fraction(metrics, 0)), "0.2510");
        assert_eq!(format!("{:.4}", metric_fraction(metrics, 3)), "0.3098");
    }

    #[test]
    fn one_reading_from_reset_decodes_like_the_kernel_read() {
        // From a reset (slots_a = 0, metric_a = 0): retiring 51/255 = 20%, bad spec 25.5/255
        // rounds to byte 26, fe 102/255 = 40%, be 76. The kernel's read() gives
        // floor(slots * byte / 255) for each metric event (topdown-formulas.md §1.2).
        let zero = reading(0, 0);
        let b = reading(1_000_000, l1(51, 26, 102, 76));
        let period = period_between(zero, b);
        assert_eq!(period.slots, 1_000_000);
        assert_eq!(&period.scaled[..4], &[200_000, 101_960, 400_000, 298_039]);
        assert_eq!(&period.scaled[4..], &[0, 0, 0, 0]);
        let fractions = period.fractions().unwrap();
        assert_eq!(
            seed_printf(&fractions),
            "Retiring 20.00% Bad Speculation 10.20% FE Bound 40.00% BE Bound 29.80%"
        );
    }

    #[test]
    fn deltas_between_two_readings_follow_the_seed() {
        // slots_a = 3000 at 0x33 0x1a 0x66 0x4c; slots_b = 9000 after a region that mostly
        // retired: bytes 0x88 0x11 0x44 0x22 (both sum to 0xff). retiring_slots =
        // 0x88*9000/255 - 0x33*3000/255 = 4800 - 600 = 4200 of slots_delta 6000 = 70%.
        let a = reading(3_000, l1(0x33, 0x1a, 0x66, 0x4c));
        let b = reading(9_000, l1(0x88, 0x11, 0x44, 0x22));
        let period = period_between(a, b);
        assert_eq!(period.slots, 6_000);
        // 0x11*9000/255 = 600 - 0x1a*3000/255 = 305 (305.88 floored) -> 295;
        // 0x44*9000/255 = 2400 - 1200 = 1200; 0x22*9000/255 = 1200 - 0x4c*3000/255 = 894 -> 306.
        assert_eq!(&period.scaled[..4], &[4_200, 295, 1_200, 306]);
        assert_eq!(
            seed_printf(&period.fractions().unwrap()),
            "Retiring 70.00% Bad Speculation 4.92% FE Bound 20.00% BE Bound 5.10%"
        );
    }

    #[test]
    fn sapphire_rapids_level_two_bytes_and_the_derived_four() {
        let period = period_between(reading(0, 0), reading(2_550, SPR_METRICS));
        assert_eq!(period.scaled, [1020, 510, 510, 510, 510, 260, 340, 170]);
        let f = period.fractions().unwrap();
        let printed = format!(
            "Heavy Operations {:.2}% Light Operations {:.2}% Branch Mispredict {:.2}% \
             Machine Clears {:.2}% Fetch Latency {:.2}% Fetch Bandwidth {:.2}% Mem Bound {:.2}% \
             Core Bound {:.2}%",
            f.heavy_operations * 100.,
            f.light_operations * 100.,
            f.branch_mispredicts * 100.,
            f.machine_clears * 100.,
            f.fetch_latency * 100.,
            f.fetch_bandwidth * 100.,
            f.memory_bound * 100.,
            f.core_bound * 100.,
        );
        assert_eq!(
            printed,
            "Heavy Operations 20.00% Light Operations 20.00% Branch Mispredict 10.20% \
             Machine Clears 9.80% Fetch Latency 13.33% Fetch Bandwidth 6.67% Mem Bound 6.67% \
             Core Bound 13.33%"
        );
    }

    #[test]
    fn decoded_counts_give_the_seeds_fractions_through_the_shared_model() {
        // The SPR vector above, as counts named like the model's counters: intel-spr's
        // formulas (topdown-formulas.md §1.4, SPR column, UOP_DROPPING 0) divide by SUM of the
        // four level-1 counts, which here equals slots, so they give the seed's fractions.
        let period = period_between(reading(0, 0), reading(2_550, SPR_METRICS));
        let mut counts: topdown_model::model::Counts = L1_FIELDS
            .iter()
            .chain(&L2_FIELDS)
            .zip(period.scaled)
            .map(|(name, value)| ((*name).to_owned(), value))
            .collect();
        counts.insert("slots".to_owned(), period.slots);
        counts.insert("INT_MISC.UOP_DROPPING".to_owned(), 0);
        let model = topdown_model::model::model_by_name("intel-spr", &[]).unwrap();
        let result = topdown_model::model::evaluate(model.as_ref(), &counts, 2);
        let f = period.fractions().unwrap();
        let expected = [
            ("retiring", f.retiring),
            ("frontend_bound", f.frontend_bound),
            ("backend_bound", f.backend_bound),
            ("bad_speculation", f.bad_speculation),
            ("heavy_operations", f.heavy_operations),
            ("light_operations", f.light_operations),
            ("branch_mispredicts", f.branch_mispredicts),
            ("machine_clears", f.machine_clears),
            ("fetch_latency", f.fetch_latency),
            ("fetch_bandwidth", f.fetch_bandwidth),
            ("memory_bound", f.memory_bound),
            ("core_bound", f.core_bound),
        ];
        for (metric, value) in expected {
            let actual = result.metrics[metric].unwrap();
            assert!(
                (actual - value).abs() < 1e-12,
                "{metric}: {actual} != {value}"
            );
        }
    }

    #[test]
    fn a_shrinking_byte_is_a_zero_delta_and_an_empty_period_has_no_fractions() {
        let a = reading(1_000, l1(0x80, 0, 0x7f, 0));
        let b = reading(1_001, l1(0x10, 0, 0xef, 0));
        let period = period_between(a, b);
        assert_eq!(period.scaled[0], 0);
        assert_eq!(period.scaled[2], 0xef * 1001 / 255 - 0x7f * 1000 / 255);
        assert_eq!(period_between(a, a).fractions(), None);
    }

    #[test]
    fn scaled_slots_do_not_overflow() {
        assert_eq!(scaled_slots(0xff, 0, u64::MAX), u64::MAX);
        // u64::MAX = 255 * 0x0101_0101_0101_0101.
        assert_eq!(scaled_slots(0x7f, 0, u64::MAX), 127 * 0x0101_0101_0101_0101);
    }

    #[test]
    fn coverage_from_enabled_and_running() {
        assert_eq!(coverage(0, 0), Coverage::Idle);
        assert_eq!(coverage(100, 0), Coverage::NeverRan);
        assert_eq!(coverage(100, 100), Coverage::Full);
        assert_eq!(coverage(200, 50), Coverage::Partial(0.25));
    }
}
