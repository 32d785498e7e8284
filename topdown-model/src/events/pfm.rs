//! libpfm4, loaded at run time (`dlopen("libpfm.so.4")`), encodes libpfm-style specs
//! (`[PMU::]EVENT[:UMASK...][:MOD[=VAL]]...`) into `perf_event_attr` words for every PMU the
//! library knows, including PMUs this machine does not have when the spec names them
//! (`knl::OFFCORE_RESPONSE_0:ANY_REQUEST:DDR_NEAR`). Loading at run time keeps the binary free
//! of a build-time dependency: without the library only libpfm-style names fail.
//!
//! The C API is libpfm4's `include/perfmon/pfmlib.h` and `pfmlib_perf_event.h`
//! (<https://perfmon2.sourceforge.net>, libpfm4 4.13): `pfm_initialize()`,
//! `pfm_get_os_event_encoding(str, dfl_plm, PFM_OS_PERF_EVENT, &pfm_perf_encode_arg_t)`,
//! `pfm_strerror()`.

use std::{
    ffi::{CStr, CString, c_char, c_int, c_void},
    sync::{Mutex, OnceLock},
};

use anyhow::{Result, bail};

/// `pfm_os_t`: `PFM_OS_PERF_EVENT` takes the PMU modifiers and `u`/`k`/`h`/`mg`/`mh` only;
/// `PFM_OS_PERF_EVENT_EXT` would also take sampling ones (`period`, `precise`, ...), which
/// counting has no use for, so they are refused by libpfm as unknown.
const PFM_OS_PERF_EVENT: c_int = 1;
/// `PFM_PLM0` (kernel) | `PFM_PLM3` (user): the default privilege levels when a spec names
/// neither `u` nor `k`.
const PFM_PLM0: c_int = 0x1;
const PFM_PLM3: c_int = 0x8;
const PFM_SUCCESS: c_int = 0;

/// `struct perf_event_attr` (linux/perf_event.h), kept as the words topdown reads. libpfm
/// copies `min(its size, attr.size)` bytes in and out, so the struct must be at least
/// `size` bytes: [`PERF_ATTR_SIZE_VER7`] = 128 covers type..config2 and the flag word.
#[repr(C)]
struct PerfEventAttr {
    perf_type: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bitfield: disabled 0, inherit 1, pinned 2, exclusive 3, exclude_user 4,
    /// exclude_kernel 5, exclude_hv 6, exclude_idle 7, ..., exclude_host 19, exclude_guest 20.
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    rest: [u64; 7],
}

const PERF_ATTR_SIZE_VER7: u32 = 128;
const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == PERF_ATTR_SIZE_VER7 as usize);

/// `pfm_perf_encode_arg_t` (pfmlib_perf_event.h); `size` must be `PFM_PERF_ENCODE_ABI0` (40
/// on LP64) or libpfm refuses the call with PFM_ERR_INVAL.
#[repr(C)]
struct PerfEncodeArg {
    attr: *mut PerfEventAttr,
    fstr: *mut *mut c_char,
    size: usize,
    idx: c_int,
    cpu: c_int,
    flags: c_int,
    pad0: c_int,
}

const _: () = assert!(std::mem::size_of::<PerfEncodeArg>() == 40);

/// libpfm's encoding of one spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoding {
    /// libpfm's PMU name (`skl`, `knl`, `amd64_fam19h_zen4`).
    pub pmu: String,
    pub perf_type: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    pub exclude_hv: bool,
    /// libpfm's canonical name with every modifier spelled out (its `fstr`).
    pub fstr: String,
}

type Initialize = unsafe extern "C" fn() -> c_int;
type OsEncoding = unsafe extern "C" fn(*const c_char, c_int, c_int, *mut c_void) -> c_int;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;

unsafe extern "C" {
    /// The process's own `free`: the one its `malloc` pairs with. libpfm's `malloc` resolves
    /// to the process's allocator (an interposed one too, as in sanitizer builds); a `free`
    /// looked up through libpfm's handle would be the C library's and could pair with
    /// another allocator's memory (found by fuzzing: an abort in free()).
    fn free(pointer: *mut c_void);
}

struct Libpfm {
    // Kept so the function pointers below stay valid for the life of the process.
    _library: libloading::Library,
    encode: OsEncoding,
    strerror: StrError,
}

/// What to tell a user whose machine has no libpfm4.
pub const MISSING: &str = "libpfm-style event names need libpfm4 (libpfm.so.4): install the \
                           `libpfm4` package, or use perf syntax (cpu/event=0x..,umask=0x../, \
                           rNNNN, or the PMU's named events from `topdown list`)";

fn load() -> Result<Libpfm, String> {
    // SAFETY: libpfm4's initialisers only set up its own tables; the symbols are looked up
    // with the C signatures of pfmlib.h. The environment is changed while no other thread of
    // topdown reads it: event specs are parsed before the counting threads start.
    unsafe {
        let library = libloading::Library::new("libpfm.so.4").map_err(|_| MISSING.to_owned())?;
        let symbol_error = |name: &str| {
            format!(
                "libpfm.so.4 lacks {name}: it is not libpfm4 >= 4.0; install the `libpfm4` package"
            )
        };
        let initialize: Initialize = *library
            .get::<Initialize>(b"pfm_initialize\0")
            .map_err(|_| symbol_error("pfm_initialize"))?;
        let encode: OsEncoding = *library
            .get::<OsEncoding>(b"pfm_get_os_event_encoding\0")
            .map_err(|_| symbol_error("pfm_get_os_event_encoding"))?;
        let strerror: StrError = *library
            .get::<StrError>(b"pfm_strerror\0")
            .map_err(|_| symbol_error("pfm_strerror"))?;
        // libpfm initialises only the PMUs it detects on this CPU unless
        // LIBPFM_ENCODE_INACTIVE=1 (libpfm(3), ENVIRONMENT), read once by pfm_initialize():
        // with it, `knl::...` encodes on any machine. Set only for the call and restored, so
        // a user's own setting is left as it was.
        let previous = std::env::var_os("LIBPFM_ENCODE_INACTIVE");
        std::env::set_var("LIBPFM_ENCODE_INACTIVE", "1");
        let status = initialize();
        match previous {
            Some(value) => std::env::set_var("LIBPFM_ENCODE_INACTIVE", value),
            None => std::env::remove_var("LIBPFM_ENCODE_INACTIVE"),
        }
        if status != PFM_SUCCESS {
            let message = CStr::from_ptr(strerror(status)).to_string_lossy();
            return Err(format!("libpfm4 failed to initialise: {message}"));
        }
        Ok(Libpfm {
            _library: library,
            encode,
            strerror,
        })
    }
}

fn library() -> &'static Result<Mutex<Libpfm>, String> {
    static LIBPFM: OnceLock<Result<Mutex<Libpfm>, String>> = OnceLock::new();
    LIBPFM.get_or_init(|| load().map(Mutex::new))
}

/// Whether libpfm4 could be loaded here.
pub fn available() -> bool {
    library().is_ok()
}

/// libpfm's PMU for a topdown model name (`intel-skl` -> `skl`), so that an unprefixed spec
/// is encoded for the model in use rather than for whatever libpfm detects. Names are those
/// of libpfm4 4.13's PMU tables (`pfm_get_pmu_info().name`); `None` for models libpfm has no
/// core PMU for, or that are not bound to one microarchitecture (software, synthetic).
pub fn pmu_for_model(model: &str) -> Option<&'static str> {
    let model = model.strip_suffix("-smt").unwrap_or(model);
    Some(match model {
        "intel-snb" => "snb",
        // One model for three generations whose libpfm tables differ: Ivy Bridge's is the
        // default; `hsw::` or `bdw::` select the others.
        "intel-ivb" => "ivb",
        "intel-skl" => "skl",
        "intel-icl" => "icl",
        "intel-spr" => "spr",
        "intel-knl" => "knl",
        "intel-knm" => "knm",
        "intel-grt" => "adl_grt",
        "amd-zen4" => "amd64_fam19h_zen4",
        "amd-zen5" => "amd64_fam1ah_zen5",
        "arm-neoverse-n1" => "arm_n1",
        "arm-neoverse-n2" | "arm-neoverse-n2-r0p0" => "arm_n2",
        "arm-neoverse-n3" => "arm_n3",
        "arm-neoverse-v1" => "arm_v1",
        "arm-neoverse-v2" => "arm_v2",
        "arm-neoverse-v3" => "arm_v3",
        _ => return None,
    })
}

/// Encodes one libpfm-style spec. `pmu` prefixes a spec that names none (`skl` turns
/// `INST_RETIRED:ANY` into `skl::INST_RETIRED:ANY`).
pub fn encode(spec: &str, pmu: Option<&str>) -> Result<Encoding> {
    let library = match library() {
        Ok(library) => library,
        Err(message) => bail!("{message}"),
    };
    let full = match pmu {
        Some(pmu) if !spec.contains("::") => format!("{pmu}::{spec}"),
        _ => spec.to_owned(),
    };
    let Ok(text) = CString::new(full.as_str()) else {
        bail!("a NUL byte in the spec");
    };
    let library = library
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut attr = PerfEventAttr {
        perf_type: 0,
        size: PERF_ATTR_SIZE_VER7,
        config: 0,
        sample_period: 0,
        sample_type: 0,
        read_format: 0,
        flags: 0,
        wakeup_events: 0,
        bp_type: 0,
        config1: 0,
        config2: 0,
        rest: [0; 7],
    };
    let mut fstr: *mut c_char = std::ptr::null_mut();
    let mut arg = PerfEncodeArg {
        attr: &mut attr,
        fstr: &mut fstr,
        size: std::mem::size_of::<PerfEncodeArg>(),
        idx: 0,
        cpu: 0,
        flags: 0,
        pad0: 0,
    };
    // SAFETY: `arg` and what it points to outlive the call; libpfm writes at most `attr.size`
    // bytes of attr and `arg.size` bytes of arg, and sets fstr to a malloc'ed C string.
    let status = unsafe {
        (library.encode)(
            text.as_ptr(),
            PFM_PLM0 | PFM_PLM3,
            PFM_OS_PERF_EVENT,
            (&mut arg as *mut PerfEncodeArg).cast(),
        )
    };
    // Only a successful encoding hands over fstr.
    let canonical = if status != PFM_SUCCESS || fstr.is_null() {
        String::new()
    } else {
        // SAFETY: libpfm returned a NUL-terminated malloc'ed string, ours to free.
        unsafe {
            let owned = CStr::from_ptr(fstr).to_string_lossy().into_owned();
            free(fstr.cast());
            owned
        }
    };
    if status != PFM_SUCCESS {
        // SAFETY: pfm_strerror returns a static string for any code.
        let message = unsafe {
            let text = (library.strerror)(status);
            if text.is_null() {
                format!("error {status}")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        // PFM_ERR_NOTFOUND (-4): also what an unknown PMU prefix gets.
        let hint = if status == -4 {
            " (libpfm's `showevtinfo` lists names; this libpfm4 may lack the PMU: Arm PMUs are \
             only built into Arm builds, and 4.13 has no gnr or Zen 5)"
        } else {
            ""
        };
        if full == spec {
            bail!("libpfm4: {message}{hint}");
        }
        bail!("libpfm4 refuses '{full}': {message}{hint}");
    }
    let pmu = canonical
        .split_once("::")
        .map_or_else(|| pmu.unwrap_or("").to_owned(), |(pmu, _)| pmu.to_owned());
    let bit = |n: u32| attr.flags >> n & 1 == 1;
    Ok(Encoding {
        pmu,
        perf_type: attr.perf_type,
        config: attr.config,
        config1: attr.config1,
        config2: attr.config2,
        exclude_user: bit(4),
        exclude_kernel: bit(5),
        exclude_hv: bit(6),
        fstr: canonical,
    })
}
