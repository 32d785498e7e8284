//! What an event spec resolves to (`perf_event_attr`'s type and config words, or a
//! tracepoint), with its privilege filters: the types the models and the counter plan take,
//! below the parsers that produce them.

/// `perf_event_attr.type` values.
pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_RAW: u32 = 4;

/// Privilege filters set by modifiers. `None` in [`EventAttr::exclude`] means "as the run's
/// `--all-user`/`--all-kernel` says".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exclude {
    pub user: bool,
    pub kernel: bool,
    pub hv: bool,
    pub host: bool,
    pub guest: bool,
    pub idle: bool,
}

/// What an event is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    Perf {
        perf_type: u32,
        config: u64,
        config1: u64,
        config2: u64,
    },
    /// A tracepoint; its id comes from tracefs when the counter is opened.
    Tracepoint { group: String, name: String },
}

/// A parsed event spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventAttr {
    /// The spec as the user wrote it: the counter's name in reports.
    pub name: String,
    /// The PMU it was resolved on, when one was named or found.
    pub pmu: Option<String>,
    pub kind: EventKind,
    pub exclude: Option<Exclude>,
}

impl EventAttr {
    /// A perf event of `perf_type` with its `(config, config1, config2)` words.
    pub fn perf(
        name: String,
        pmu: Option<String>,
        perf_type: u32,
        (config, config1, config2): (u64, u64, u64),
        exclude: Option<Exclude>,
    ) -> Self {
        Self {
            name,
            pmu,
            kind: EventKind::Perf {
                perf_type,
                config,
                config1,
                config2,
            },
            exclude,
        }
    }
}
