//! libnftables, in process: one [`NftContext`] per pod netns, one buffer per transaction.
//!
//! Why not the `nft` program: a transaction streamed into `nft` (`nft -f -`, `nft -i`) is
//! parsed from whatever arrived when its input ends, so an agent killed while writing a large
//! transaction made `nft` commit the prefix it had — a flushed chain without its rules, a pod
//! left open. Here the whole transaction is one buffer handed to `nft_run_cmd_from_buffer`,
//! which parses all of it before it sends one netlink batch (`BEGIN … END` in one `sendmsg`):
//! the kernel commits everything or nothing, and a process killed at any point cannot send half.
//! Errors come back in a buffer of their own, not interleaved with other output.
//!
//! The library is opened at run time (`libnftables.so.1`, shipped with the `nft` program), so
//! the iptables backend and the analysis commands work on a machine without it.
//!
//! Facts of libnftables 1.0.x this module relies on:
//! - `nft_ctx_new` opens the context's netlink socket at once, in the network namespace of the
//!   calling thread, and the socket stays in that namespace: a context is created on a thread
//!   that entered the pod netns, and then serves that netns only.
//! - `nft_ctx_new` initialises process-wide state the first time it runs (unguarded), and
//!   `nft_ctx_free` releases a process-wide interface cache: both are serialised here.
//! - Commands parsed from JSON only when the JSON output flag is set.
//! - Printing a listing is not thread-safe in 1.0.6 (Debian 12): the JSON printer splits set
//!   type names with `strtok` (process-wide state; upstream moved to `strtok_r` later), and
//!   time expressions print through `localtime`/`gmtime`. Two listings printed at once in two
//!   threads aborted the process (`set_dtype_json: Assertion '__out' failed`). Listings are
//!   serialised here; transactions print nothing and run in parallel.
//! - Rules that name interfaces by index (`iif`, `oif`) resolve names through that same
//!   process-wide cache, in the caller's namespace: the renderer never emits them
//!   (`iifname`/`oifname` string compares only), so concurrent contexts share no mutable state.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The shared object of libnftables 1.x.
pub const LIBRARY: &str = "libnftables.so.1";

const NFT_CTX_DEFAULT: u32 = 0;
const OUTPUT_JSON: c_uint = 1 << 4;
const OUTPUT_TERSE: c_uint = 1 << 11;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibnftError {
    #[error("cannot load {LIBRARY} (install the nftables package): {0}")]
    Load(String),
    #[error("libnftables could not create a context")]
    Context,
    #[error("a transaction holds a NUL byte")]
    Nul,
    /// nft refused the commands: nothing of them was applied. Its message.
    #[error("nft refused the transaction: {0}")]
    Refused(String),
}

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxStr = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type CtxSetFlags = unsafe extern "C" fn(*mut c_void, c_uint);
type CtxSetBool = unsafe extern "C" fn(*mut c_void, bool);
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// The functions used, resolved once.
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_output: CtxInt,
    buffer_error: CtxInt,
    output_buffer: CtxStr,
    error_buffer: CtxStr,
    set_output_flags: CtxSetFlags,
    set_dry_run: CtxSetBool,
    run_cmd: RunCmd,
    /// Keeps the library mapped for as long as the process runs.
    _library: libloading::Library,
}

fn load() -> Result<Api, String> {
    // SAFETY: loading libnftables runs its ELF constructors, which only initialise its own
    // globals; the symbols below are resolved with the C signatures of libnftables.h.
    unsafe {
        let library = libloading::Library::new(LIBRARY).map_err(|e| e.to_string())?;
        let sym = |name: &[u8]| -> Result<*const (), String> {
            library
                .get::<*const ()>(name)
                .map(|s| *s)
                .map_err(|e| e.to_string())
        };
        Ok(Api {
            ctx_new: std::mem::transmute::<*const (), CtxNew>(sym(b"nft_ctx_new\0")?),
            ctx_free: std::mem::transmute::<*const (), CtxFree>(sym(b"nft_ctx_free\0")?),
            buffer_output: std::mem::transmute::<*const (), CtxInt>(sym(
                b"nft_ctx_buffer_output\0",
            )?),
            buffer_error: std::mem::transmute::<*const (), CtxInt>(sym(b"nft_ctx_buffer_error\0")?),
            output_buffer: std::mem::transmute::<*const (), CtxStr>(sym(
                b"nft_ctx_get_output_buffer\0",
            )?),
            error_buffer: std::mem::transmute::<*const (), CtxStr>(sym(
                b"nft_ctx_get_error_buffer\0",
            )?),
            set_output_flags: std::mem::transmute::<*const (), CtxSetFlags>(sym(
                b"nft_ctx_output_set_flags\0",
            )?),
            set_dry_run: std::mem::transmute::<*const (), CtxSetBool>(sym(
                b"nft_ctx_set_dry_run\0",
            )?),
            run_cmd: std::mem::transmute::<*const (), RunCmd>(sym(b"nft_run_cmd_from_buffer\0")?),
            _library: library,
        })
    }
}

fn api() -> Result<&'static Api, LibnftError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| LibnftError::Load(e.clone()))
}

/// Whether libnftables can be loaded here.
pub fn available() -> bool {
    api().is_ok()
}

/// Calls into libnftables made by this process, by kind. Tests assert on these (what a
/// restart costs the kernel and libnftables) rather than on time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// JSON command batches run (each one netlink transaction; dry runs not counted).
    pub transactions: u64,
    /// Listings (`list …`).
    pub listings: u64,
    /// The listings for which libnftables 1.0.6 fetches every element of every set: all but
    /// a terse `list ruleset` (see `nft_apply::list_ruleset`).
    pub element_listings: u64,
}

static TRANSACTIONS: AtomicU64 = AtomicU64::new(0);
static LISTINGS: AtomicU64 = AtomicU64::new(0);
static ELEMENT_LISTINGS: AtomicU64 = AtomicU64::new(0);

/// The calls made so far by this process.
pub fn call_counts() -> CallCounts {
    CallCounts {
        transactions: TRANSACTIONS.load(Ordering::Relaxed),
        listings: LISTINGS.load(Ordering::Relaxed),
        element_listings: ELEMENT_LISTINGS.load(Ordering::Relaxed),
    }
}

/// Whether `commands` is a listing (nft syntax `list …`; JSON `{"nftables": [{"list": …}]}`
/// is never sent by this crate).
fn is_listing(commands: &str) -> bool {
    commands.trim_start().starts_with("list")
}

fn count_call(commands: &str, output: Output, dry_run: bool) {
    let command = commands.trim_start();
    if is_listing(command) {
        LISTINGS.fetch_add(1, Ordering::Relaxed);
        if !(output == Output::JsonTerse && command.trim_end() == "list ruleset") {
            ELEMENT_LISTINGS.fetch_add(1, Ordering::Relaxed);
        }
    } else if !dry_run {
        TRANSACTIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Serialises context creation and destruction (process-wide state, see the module doc).
static LIFECYCLE: Mutex<()> = Mutex::new(());

/// Serialises listings: printing them uses process-wide state (see the module doc).
static LISTING: Mutex<()> = Mutex::new(());

/// How a command's output is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// nft syntax, as `nft list` prints it.
    Text,
    /// JSON (the input is JSON too), set elements included.
    Json,
    /// JSON without set elements (what planning needs: names).
    JsonTerse,
}

/// A libnftables context bound to the network namespace it was created in.
pub struct NftContext {
    ctx: NonNull<c_void>,
}

// SAFETY: a context is plain heap state plus a socket; it is used by one thread at a time
// (`&mut self` on every call), which is all libnftables requires of a context.
unsafe impl Send for NftContext {}

impl std::fmt::Debug for NftContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftContext").finish_non_exhaustive()
    }
}

impl NftContext {
    /// A context for the network namespace of the calling thread.
    pub fn new() -> Result<NftContext, LibnftError> {
        let api = api()?;
        let _guard = LIFECYCLE.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: nft_ctx_new has no preconditions; a null return is handled.
        let ctx =
            NonNull::new(unsafe { (api.ctx_new)(NFT_CTX_DEFAULT) }).ok_or(LibnftError::Context)?;
        // SAFETY: ctx is a live context; buffering makes output and errors readable through
        // the getters instead of going to the process's stdout/stderr.
        unsafe {
            (api.buffer_output)(ctx.as_ptr());
            (api.buffer_error)(ctx.as_ptr());
        }
        Ok(NftContext { ctx })
    }

    /// Runs `commands` (JSON when `output` is a JSON form, else nft syntax) as one batch;
    /// returns what nft printed. Nothing is applied when it fails.
    pub fn run(&mut self, commands: &str, output: Output) -> Result<String, LibnftError> {
        self.run_inner(commands, output, false)
    }

    /// Checks `commands` against the kernel without applying anything (`nft -c`).
    pub fn check(&mut self, commands: &str, output: Output) -> Result<(), LibnftError> {
        self.run_inner(commands, output, true).map(drop)
    }

    fn run_inner(
        &mut self,
        commands: &str,
        output: Output,
        dry_run: bool,
    ) -> Result<String, LibnftError> {
        let api = api()?;
        let buffer = CString::new(commands).map_err(|_| LibnftError::Nul)?;
        count_call(commands, output, dry_run);
        let flags = match output {
            Output::Text => 0,
            Output::Json => OUTPUT_JSON,
            Output::JsonTerse => OUTPUT_JSON | OUTPUT_TERSE,
        };
        let ctx = self.ctx.as_ptr();
        let _printing =
            is_listing(commands).then(|| LISTING.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: ctx is live and used by this thread only (`&mut self`); the buffer is a
        // NUL-terminated string that outlives the call; the returned buffers are owned by the
        // context and copied before the next call on it.
        unsafe {
            (api.set_output_flags)(ctx, flags);
            (api.set_dry_run)(ctx, dry_run);
            let rc = (api.run_cmd)(ctx, buffer.as_ptr());
            (api.set_dry_run)(ctx, false);
            let out = copy_buffer((api.output_buffer)(ctx));
            let err = copy_buffer((api.error_buffer)(ctx));
            if rc == 0 {
                Ok(out)
            } else {
                Err(LibnftError::Refused(err.trim_end().to_string()))
            }
        }
    }
}

/// Copies a C string owned by libnftables (null: empty).
///
/// # Safety
/// `p` is null or a valid NUL-terminated string.
unsafe fn copy_buffer(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

impl Drop for NftContext {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            let _guard = LIFECYCLE.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the context is live and dropped once; freeing closes its socket.
            unsafe { (api.ctx_free)(self.ctx.as_ptr()) }
        }
    }
}
