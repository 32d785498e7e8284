//! The C API of include/topdown_region.h. Every entry point catches panics: unwinding into a
//! C caller is undefined behaviour, so a panic becomes an error return (or nothing, for the
//! void functions) instead.

use std::{
    ffi::{CStr, CString, c_char, c_int},
    panic::{AssertUnwindSafe, catch_unwind},
};

use crate::{counters::ReadPath, regions, report, setup::Config};

thread_local! {
    /// The last message handed to C on this thread; valid until the thread's next call that
    /// returns a message.
    static MESSAGE: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

fn guarded<T>(fallback: T, action: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(action)).unwrap_or(fallback)
}

/// A C string as UTF-8 (invalid bytes replaced); `None` for NULL.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string.
unsafe fn text_of<'a>(text: *const c_char) -> Option<std::borrow::Cow<'a, str>> {
    if text.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(text) }.to_string_lossy())
}

/// Keeps `message` for the caller and returns it as a C string.
fn hand_out(message: &str) -> *const c_char {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    MESSAGE
        .try_with(|slot| {
            let mut slot = slot.borrow_mut();
            *slot = text;
            slot.as_ptr()
        })
        .unwrap_or(c"thread is exiting".as_ptr())
}

/// `td_region_init(model, level)`: 0, or -1 with the reason in `td_region_message()`.
///
/// # Safety
/// `model` is NULL (the environment's or default model) or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn td_region_init(model: *const c_char, level: c_int) -> c_int {
    guarded(-1, || {
        let mut config = match Config::from_env() {
            Ok(config) => config,
            Err(err) => {
                hand_out(&err);
                return -1;
            }
        };
        // SAFETY: forwarded from the caller.
        if let Some(model) = unsafe { text_of(model) } {
            config.model = model.into_owned();
        }
        if level > 0 {
            config.level = u8::try_from(level).unwrap_or(u8::MAX);
        }
        match regions::init(config) {
            Ok(()) => 0,
            Err(err) => {
                hand_out(&err);
                -1
            }
        }
    })
}

/// # Safety
/// `name` is a NUL-terminated string (NULL is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn td_region_begin(name: *const c_char) {
    guarded((), || {
        // SAFETY: forwarded from the caller.
        if let Some(name) = unsafe { text_of(name) } {
            regions::begin(&name);
        }
    })
}

/// # Safety
/// `name` is a NUL-terminated string (NULL is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn td_region_end(name: *const c_char) {
    guarded((), || {
        // SAFETY: forwarded from the caller.
        if let Some(name) = unsafe { text_of(name) } {
            regions::end(&name);
        }
    })
}

/// The calling thread's read path (`TD_REGION_PATH_*`).
#[unsafe(no_mangle)]
pub extern "C" fn td_region_path() -> c_int {
    guarded(ReadPath::Disabled as c_int, || {
        regions::thread_path().0 as c_int
    })
}

/// Why the calling thread reads its counters the way it does.
#[unsafe(no_mangle)]
pub extern "C" fn td_region_reason() -> *const c_char {
    guarded(c"internal error".as_ptr(), || {
        hand_out(&regions::thread_path().1)
    })
}

/// The last error message of this thread's `td_region_init` / `td_region_write_json`.
#[unsafe(no_mangle)]
pub extern "C" fn td_region_message() -> *const c_char {
    guarded(c"internal error".as_ptr(), || {
        MESSAGE
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(c"thread is exiting".as_ptr())
    })
}

/// Writes the topdown JSON report to `path`: 0, or -1 with the reason in
/// `td_region_message()`.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn td_region_write_json(path: *const c_char) -> c_int {
    guarded(-1, || {
        // SAFETY: forwarded from the caller.
        let Some(path) = (unsafe { text_of(path) }) else {
            hand_out("td_region_write_json: path is NULL");
            return -1;
        };
        match report::write_json(&regions::snapshot(), std::path::Path::new(&*path)) {
            Ok(()) => 0,
            Err(err) => {
                hand_out(&err);
                -1
            }
        }
    })
}

/// Prints the text summary to stderr.
#[unsafe(no_mangle)]
pub extern "C" fn td_region_print_summary() {
    guarded((), || {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(report::summary(&regions::snapshot()).as_bytes());
    })
}

/// Misuse counted on all threads so far (unmatched, mismatched and unknown ends, too-deep
/// begins, regions open at thread exit).
#[unsafe(no_mangle)]
pub extern "C" fn td_region_misuse_count() -> u64 {
    guarded(0, || {
        regions::snapshot()
            .threads
            .iter()
            .map(|thread| {
                let misuse = &thread.misuse;
                misuse.unmatched_ends
                    + misuse.mismatched_ends
                    + misuse.unknown_ends
                    + misuse.too_deep
                    + misuse.open_at_exit
            })
            .sum()
    })
}
