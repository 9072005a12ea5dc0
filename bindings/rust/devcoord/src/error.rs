//! [`Error`]: a failed devcoord call, with its gRPC-style [`Code`] and the server's message.

use std::ffi::CStr;
use std::fmt;

use devcoord_sys as sys;

/// gRPC's canonical status codes, numbered as `include/devcoord/status.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// The call was cancelled.
    Cancelled = 1,
    /// An error without a better code (also any number outside this table).
    Unknown = 2,
    /// The request is malformed: bad device text, refused device list, wrong dtype...
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// A device, tensor, worker or op does not exist.
    NotFound = 5,
    /// The thing to create exists already.
    AlreadyExists = 6,
    /// The token's role may not make this call.
    PermissionDenied = 7,
    /// A limit was reached.
    ResourceExhausted = 8,
    /// The cluster is not in a state that allows the call (cordoned worker, ...).
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// A value is outside its range.
    OutOfRange = 11,
    /// Not implemented by the server.
    Unimplemented = 12,
    /// A bug on the other side.
    Internal = 13,
    /// The server or a worker cannot be reached or is not serving.
    Unavailable = 14,
    /// Data was lost.
    DataLoss = 15,
    /// No token, or an unknown one.
    Unauthenticated = 16,
}

impl Code {
    const ALL: [Code; 16] = [
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code of a non-zero `dc_code` number (`Unknown` outside the table).
    pub fn from_raw(number: i32) -> Code {
        Code::ALL.iter().copied().find(|c| *c as i32 == number).unwrap_or(Code::Unknown)
    }

    /// The code's name, `"INVALID_ARGUMENT"`.
    pub fn name(self) -> &'static str {
        // SAFETY: dc_status_name returns a static string for every number.
        unsafe { CStr::from_ptr(sys::dc_status_name(self as i32)) }.to_str().unwrap_or("UNKNOWN")
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: its code and the server's (or, for local checks, the library's) message.
/// Displays as `"INVALID_ARGUMENT: message"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The status code.
    pub code: Code,
    /// The message.
    pub message: String,
    /// True when no answer came from the server (unreachable, TLS failure, deadline).
    pub transport: bool,
    /// Index of the offending entry of a device list, when one was at fault.
    pub device_index: Option<usize>,
    /// The worker the failure is about, when there is one.
    pub worker: Option<String>,
}

impl Error {
    /// An error made on this side (no server involved).
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code, message: message.into(), transport: false, device_index: None, worker: None }
    }

    pub(crate) fn from_status(code: i32, st: &sys::dc_status) -> Error {
        let worker = crate::client::cstr_array(&st.worker);
        Error {
            code: Code::from_raw(code),
            message: crate::client::cstr_array(&st.message),
            transport: st.transport,
            device_index: usize::try_from(st.device_index).ok(),
            worker: if worker.is_empty() { None } else { Some(worker) },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
