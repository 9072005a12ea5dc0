//! [`Client`]: registry, operations, tensors and cluster status of a devcoord cluster, over
//! libdevcoord.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_void};
use std::ptr::{self, NonNull};

use devcoord_sys as sys;

use crate::device::DeviceRef;
use crate::error::{Code, Error, Result};

// ---- strings ---------------------------------------------------------------------------

/// A NUL-terminated C array as a String (up to the NUL, or the whole array).
pub(crate) fn cstr_array(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn cstr_ptr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library hands out NUL-terminated strings that live as long as their owner.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub(crate) fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Code::InvalidArgument, format!("{:?} contains a NUL byte", s)))
}

fn opt_cstring(s: &Option<String>) -> Result<Option<CString>> {
    s.as_deref().map(cstring).transpose()
}

fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

fn name(f: unsafe extern "C" fn(i32) -> *const c_char, value: i32) -> String {
    // SAFETY: the *_name functions return a static string or NULL.
    let p = unsafe { f(value) };
    if p.is_null() {
        value.to_string()
    } else {
        cstr_ptr(p)
    }
}

pub(crate) fn status() -> sys::dc_status {
    // SAFETY: dc_status is plain data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

fn check(code: i32, st: &sys::dc_status) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::from_status(code, st))
    }
}

/// Parses the text form of a device reference with libdevcoord.
pub(crate) fn parse_ref(text: &str) -> Result<sys::dc_device_ref> {
    // SAFETY: zeroes are a valid dc_device_ref; the text is passed with its length.
    let mut r: sys::dc_device_ref = unsafe { std::mem::zeroed() };
    let mut st = status();
    let code = unsafe { sys::dc_device_ref_parse(text.as_ptr() as *const c_char, text.len(), &mut r, &mut st) };
    check(code, &st).map(|_| r)
}

fn ref_text(r: &sys::dc_device_ref) -> String {
    let mut buf = [0 as c_char; sys::DC_DEVICE_TEXT_SIZE];
    // SAFETY: the buffer has DC_DEVICE_TEXT_SIZE bytes, which always suffice.
    unsafe { sys::dc_device_ref_format(r, buf.as_mut_ptr(), buf.len()) };
    cstr_array(&buf)
}

/// Canonical text of a concrete C device, `"cuda:0"`.
pub(crate) fn device_text(d: &sys::dc_device) -> String {
    let mut buf = [0 as c_char; sys::DC_DEVICE_TEXT_SIZE];
    // SAFETY: as ref_text.
    unsafe { sys::dc_device_format(d, buf.as_mut_ptr(), buf.len()) };
    cstr_array(&buf)
}

/// A pointer the library allocated, freed with its *_free function on drop.
struct Owned<T> {
    ptr: *mut T,
    free: unsafe extern "C" fn(*mut T),
}

impl<T> Owned<T> {
    fn new(free: unsafe extern "C" fn(*mut T)) -> Owned<T> {
        Owned { ptr: ptr::null_mut(), free }
    }

    fn get(&self) -> Option<&T> {
        // SAFETY: non-null pointers come from the library and live until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by the library, freed once.
            unsafe { (self.free)(self.ptr) };
        }
    }
}

fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the library's arrays hold n elements.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

// ---- results ---------------------------------------------------------------------------

/// A worker as the registry has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// Its name, `"node-a"`.
    pub name: String,
    /// Its data address.
    pub address: String,
    /// `"alive"`, `"dead"`, `"cordoned"` or `"draining"`.
    pub state: String,
    /// Registration epoch.
    pub epoch: u64,
    /// Number of devices.
    pub device_count: u32,
    /// Its executor (`"host"`, ...).
    pub executor: String,
    /// Time since its last heartbeat.
    pub since_heartbeat_ms: u64,
    /// Largest message its data address takes (0: not said).
    pub max_message_bytes: u64,
    /// Its labels, in registry order.
    pub labels: Vec<(String, String)>,
}

impl Worker {
    fn from_raw(w: &sys::dc_worker_info) -> Worker {
        Worker {
            name: cstr_array(&w.name),
            address: cstr_array(&w.address),
            state: name(sys::dc_worker_state_name, w.state),
            epoch: w.epoch,
            device_count: w.device_count,
            executor: cstr_array(&w.executor),
            since_heartbeat_ms: w.since_heartbeat_ms,
            max_message_bytes: w.max_message_bytes,
            labels: slice(w.labels, w.n_labels).iter().map(|l| (cstr_ptr(l.key), cstr_ptr(l.value))).collect(),
        }
    }
}

/// A registered device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Cluster name, `"node-a/cuda:0"`.
    pub name: String,
    /// Owning worker.
    pub worker: String,
    /// Concrete device text, `"cuda:0"`.
    pub text: String,
    /// The device as a [`crate::Device`] (None for values it cannot hold, e.g. `cpu:1`).
    pub device: Option<crate::Device>,
    /// `"healthy"`, `"unhealthy"` or `"dead"`.
    pub state: String,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

impl DeviceInfo {
    fn from_raw(d: &sys::dc_device_info) -> DeviceInfo {
        DeviceInfo {
            name: cstr_ptr(d.name),
            worker: cstr_ptr(d.worker),
            text: device_text(&d.device),
            device: crate::Device::from_raw(&d.device, 0).ok(),
            state: name(sys::dc_device_state_name, d.state),
            memory_bytes: d.memory_bytes,
        }
    }
}

/// Counts of workers, devices and ops, and readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    /// Workers alive.
    pub workers_alive: u32,
    /// Workers dead.
    pub workers_dead: u32,
    /// Workers cordoned.
    pub workers_cordoned: u32,
    /// Workers draining.
    pub workers_draining: u32,
    /// Devices per backend name (every backend, `("cuda", 4)`).
    pub devices_by_backend: Vec<(String, u32)>,
    /// Ops running or queued.
    pub ops_in_flight: u64,
    /// Ops done.
    pub ops_done: u64,
    /// Ops failed.
    pub ops_failed: u64,
    /// Whether the coordinator is ready.
    pub ready: bool,
}

/// Operation kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Every rank ends with the reduction of all ranks' tensors.
    AllReduce = 1,
    /// The root ends with the reduction.
    Reduce = 2,
    /// Every rank ends with the root's tensor.
    Broadcast = 3,
    /// Every rank ends with all tensors concatenated in rank order.
    AllGather = 4,
    /// Every rank waits for all.
    Barrier = 5,
}

/// Reduce operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum = 1,
    /// Mean.
    Mean = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Product.
    Prod = 5,
}

/// An operation to plan or submit: kind, devices in rank order, tensor name and options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRequest {
    /// The kind.
    pub kind: OpKind,
    /// Reduce op (all-reduce and reduce).
    pub reduce: Option<ReduceOp>,
    /// Rank of the root (broadcast and reduce).
    pub root: u32,
    /// Devices in rank order.
    pub devices: Vec<DeviceRef>,
    /// Name of the tensor on every device.
    pub tensor: String,
    /// All-gather's output (None: `"<tensor>.gathered"`).
    pub output_tensor: Option<String>,
    /// Deadline of the op (0: the coordinator's default).
    pub timeout_ms: u32,
}

impl OpRequest {
    /// An op of `kind` on `devices` and `tensor`, without reduce op or root.
    pub fn new(kind: OpKind, devices: Vec<DeviceRef>, tensor: &str) -> OpRequest {
        OpRequest { kind, reduce: None, root: 0, devices, tensor: tensor.to_string(), output_tensor: None, timeout_ms: 0 }
    }

    /// An all-reduce with `reduce`.
    pub fn all_reduce(devices: Vec<DeviceRef>, tensor: &str, reduce: ReduceOp) -> OpRequest {
        OpRequest { reduce: Some(reduce), ..OpRequest::new(OpKind::AllReduce, devices, tensor) }
    }

    /// A broadcast from rank `root`.
    pub fn broadcast(devices: Vec<DeviceRef>, tensor: &str, root: u32) -> OpRequest {
        OpRequest { root, ..OpRequest::new(OpKind::Broadcast, devices, tensor) }
    }
}

/// One worker of an op's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanWorker {
    /// Worker name.
    pub name: String,
    /// Its data address.
    pub address: String,
    /// The ranks it holds (indices into [`OpResult::devices`]).
    pub ranks: Vec<u32>,
}

/// One worker's answer to an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerResult {
    /// Worker name.
    pub name: String,
    /// None for OK, else the code.
    pub code: Option<Code>,
    /// Its message.
    pub message: String,
    /// Time it spent.
    pub elapsed_us: u64,
}

/// An op as the coordinator reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpResult {
    /// Its id.
    pub op_id: String,
    /// `"all-reduce"`, ...
    pub kind: String,
    /// `"sum"`, ... when it has one.
    pub reduce: Option<String>,
    /// Root rank.
    pub root: u32,
    /// Tensor name.
    pub tensor: String,
    /// Output tensor name (all-gather).
    pub output_tensor: String,
    /// `"queued"`, `"running"`, `"done"`, `"failed"`.
    pub state: String,
    /// The op's error, None when it succeeded (or is still running).
    pub error: Option<Error>,
    /// Group id of the plan.
    pub group_id: String,
    /// Concrete devices in rank order, text form (`"node-a/cuda:0"`).
    pub devices: Vec<String>,
    /// The plan: ranks grouped by worker.
    pub plan: Vec<PlanWorker>,
    /// Per-worker answers.
    pub results: Vec<WorkerResult>,
    /// Workers that have not answered yet.
    pub waiting_on: Vec<String>,
    /// Submission time (Unix ms).
    pub submitted_unix_ms: u64,
    /// Run time.
    pub elapsed_us: u64,
}

impl OpResult {
    fn from_raw(r: &sys::dc_op_result) -> OpResult {
        OpResult {
            op_id: cstr_array(&r.op_id),
            kind: name(sys::dc_op_kind_name, r.kind),
            reduce: if r.reduce == 0 { None } else { Some(name(sys::dc_reduce_op_name, r.reduce)) },
            root: r.root,
            tensor: cstr_array(&r.tensor),
            output_tensor: cstr_array(&r.output_tensor),
            state: name(sys::dc_op_state_name, r.state),
            error: check(r.status.code, &r.status).err(),
            group_id: cstr_array(&r.group_id),
            devices: slice(r.devices, r.n_devices).iter().map(ref_text).collect(),
            plan: slice(r.plan_workers, r.n_plan_workers)
                .iter()
                .map(|p| PlanWorker {
                    name: cstr_array(&p.name),
                    address: cstr_array(&p.address),
                    ranks: slice(p.ranks, p.n_ranks).to_vec(),
                })
                .collect(),
            results: slice(r.results, r.n_results)
                .iter()
                .map(|w| WorkerResult {
                    name: cstr_array(&w.name),
                    code: if w.code == 0 { None } else { Some(Code::from_raw(w.code)) },
                    message: cstr_array(&w.message),
                    elapsed_us: w.elapsed_us,
                })
                .collect(),
            waiting_on: slice(r.waiting_on, r.n_waiting).iter().map(|w| cstr_array(w)).collect(),
            submitted_unix_ms: r.submitted_unix_ms,
            elapsed_us: r.elapsed_us,
        }
    }
}

/// A stored tensor as a listing shows it (no data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Device cluster name.
    pub device: String,
    /// Tensor name.
    pub name: String,
    /// dtype name, `"f32"`.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Size in bytes.
    pub size_bytes: usize,
}

/// A tensor read back: its shape and elements (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<T> {
    /// Shape.
    pub shape: Vec<u64>,
    /// Elements.
    pub data: Vec<T>,
}

mod sealed {
    pub trait Sealed {}
}

/// Element types tensors can hold: `f32`, `f64`, `i32`, `i64`, [`F16`], [`BF16`].
pub trait Element: sealed::Sealed + Copy + Default {
    /// The library's dtype number.
    const DTYPE: i32;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: i32 = $d;
        }
    };
}
element!(f32, sys::DC_DTYPE_F32);
element!(f64, sys::DC_DTYPE_F64);
element!(i32, sys::DC_DTYPE_I32);
element!(i64, sys::DC_DTYPE_I64);
element!(crate::half::F16, sys::DC_DTYPE_F16);
element!(crate::half::BF16, sys::DC_DTYPE_BF16);

// ---- the client --------------------------------------------------------------------------

/// Connection options; `Default` is no token, plain TCP, the library's 30 s deadline, and
/// dialing in the background (no fail-fast).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Bearer token (None: `$DEVCOORD_TOKEN`, then `$DEVCOORD_TOKEN_FILE`).
    pub token: Option<String>,
    /// File whose first line is the token.
    pub token_file: Option<String>,
    /// Deadline of each call in ms (0: 30000).
    pub timeout_ms: u32,
    /// Fail at connect when the coordinator cannot be reached.
    pub fail_fast: bool,
    /// PEM file of the CA that verifies the servers (tls+tcp:// addresses).
    pub tls_ca: Option<String>,
    /// PEM client certificate.
    pub tls_cert: Option<String>,
    /// PEM client key.
    pub tls_key: Option<String>,
    /// Name checked against the servers' certificates (default: the address's host).
    pub tls_server_name: Option<String>,
}

/// A client of a devcoord coordinator (and, for tensors, its workers). Closed on drop. Safe to
/// share between threads (`Send + Sync`): libdevcoord's client is thread-safe.
pub struct Client {
    raw: NonNull<sys::dc_client>,
}

// SAFETY: libdevcoord documents a dc_client as safe to use from many threads at once.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: opened by dc_client_open, closed once.
        unsafe { sys::dc_client_close(self.raw.as_ptr()) };
    }
}

impl Client {
    /// Connects to the coordinator at `address` (`"tcp://HOST:PORT"`, `"tls+tcp://..."` or
    /// `"HOST:PORT"`) with default [`Options`].
    pub fn connect(address: &str) -> Result<Client> {
        Client::connect_with(address, &Options::default())
    }

    /// Connects with `opts`.
    pub fn connect_with(address: &str, opts: &Options) -> Result<Client> {
        let addr = cstring(address)?;
        let strs = [&opts.token, &opts.token_file, &opts.tls_ca, &opts.tls_cert, &opts.tls_key, &opts.tls_server_name]
            .iter()
            .map(|s| opt_cstring(s))
            .collect::<Result<Vec<_>>>()?;
        let o = sys::dc_client_options {
            token: opt_ptr(&strs[0]),
            token_file: opt_ptr(&strs[1]),
            timeout_ms: opts.timeout_ms,
            fail_fast: opts.fail_fast,
            tls_ca: opt_ptr(&strs[2]),
            tls_cert: opt_ptr(&strs[3]),
            tls_key: opt_ptr(&strs[4]),
            tls_server_name: opt_ptr(&strs[5]),
        };
        let mut out = ptr::null_mut();
        let mut st = status();
        // SAFETY: every pointer lives across the call.
        check(unsafe { sys::dc_client_open(addr.as_ptr(), &o, &mut out, &mut st) }, &st)?;
        NonNull::new(out).map(|raw| Client { raw }).ok_or_else(|| Error::new(Code::Internal, "dc_client_open gave no client"))
    }

    pub(crate) fn raw_ptr(&self) -> *mut sys::dc_client {
        self.raw.as_ptr()
    }

    fn call(&self, f: impl FnOnce(*mut sys::dc_client, *mut sys::dc_status) -> i32) -> Result<()> {
        let mut st = status();
        let code = f(self.raw.as_ptr(), &mut st);
        check(code, &st)
    }

    /// Every registered worker.
    pub fn workers(&self) -> Result<Vec<Worker>> {
        let mut out = Owned::new(sys::dc_worker_list_free);
        self.call(|c, st| unsafe { sys::dc_list_workers(c, &mut out.ptr, st) })?;
        Ok(out.get().map_or(vec![], |l| slice(l.workers, l.n).iter().map(Worker::from_raw).collect()))
    }

    /// Every registered device, in registry order.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let mut out = Owned::new(sys::dc_device_list_free);
        self.call(|c, st| unsafe { sys::dc_list_devices(c, ptr::null(), &mut out.ptr, st) })?;
        Ok(out.get().map_or(vec![], |l| slice(l.devices, l.n).iter().map(DeviceInfo::from_raw).collect()))
    }

    /// One device by cluster name (`"node-a/cuda:0"`).
    pub fn device(&self, name: &str) -> Result<DeviceInfo> {
        let n = cstring(name)?;
        // SAFETY: zeroes are a valid empty record; cleared whatever the outcome.
        let mut info: sys::dc_device_info = unsafe { std::mem::zeroed() };
        let r = self.call(|c, st| unsafe { sys::dc_get_device(c, n.as_ptr(), &mut info, st) });
        let d = DeviceInfo::from_raw(&info);
        unsafe { sys::dc_device_info_clear(&mut info) };
        r.map(|_| d)
    }

    fn steer(
        &self,
        f: unsafe extern "C" fn(*mut sys::dc_client, *const c_char, *mut sys::dc_worker_info, *mut sys::dc_status) -> i32,
        worker: &str,
    ) -> Result<Worker> {
        let n = cstring(worker)?;
        // SAFETY: as in device().
        let mut info: sys::dc_worker_info = unsafe { std::mem::zeroed() };
        let r = self.call(|c, st| unsafe { f(c, n.as_ptr(), &mut info, st) });
        let w = Worker::from_raw(&info);
        unsafe { sys::dc_worker_info_clear(&mut info) };
        r.map(|_| w)
    }

    /// Cordons a worker; returns it as it is afterwards.
    pub fn cordon(&self, worker: &str) -> Result<Worker> {
        self.steer(sys::dc_cordon_worker, worker)
    }

    /// Uncordons a worker; returns it as it is afterwards.
    pub fn uncordon(&self, worker: &str) -> Result<Worker> {
        self.steer(sys::dc_uncordon_worker, worker)
    }

    /// Drains a worker; returns it as it is afterwards.
    pub fn drain(&self, worker: &str) -> Result<Worker> {
        self.steer(sys::dc_drain_worker, worker)
    }

    /// Worker, device and op counts, and readiness.
    pub fn cluster_status(&self) -> Result<ClusterStatus> {
        // SAFETY: plain data.
        let mut s: sys::dc_cluster_status = unsafe { std::mem::zeroed() };
        self.call(|c, st| unsafe { sys::dc_cluster_status_get(c, &mut s, st) })?;
        Ok(ClusterStatus {
            workers_alive: s.workers_alive,
            workers_dead: s.workers_dead,
            workers_cordoned: s.workers_cordoned,
            workers_draining: s.workers_draining,
            devices_by_backend: (1..sys::DC_BACKEND_COUNT)
                .map(|b| (name(sys::dc_backend_name, b as i32), s.devices_by_backend[b]))
                .collect(),
            ops_in_flight: s.ops_in_flight,
            ops_done: s.ops_done,
            ops_failed: s.ops_failed,
            ready: s.ready,
        })
    }

    /// Ok when the coordinator answers and is ready.
    pub fn health(&self) -> Result<()> {
        self.call(|c, st| unsafe { sys::dc_health(c, st) })
    }

    fn run(&self, req: &OpRequest, dry_run: bool) -> Result<OpResult> {
        let refs = req.devices.iter().map(DeviceRef::to_raw).collect::<Result<Vec<_>>>()?;
        let tensor = cstring(&req.tensor)?;
        let output = opt_cstring(&req.output_tensor)?;
        let raw = sys::dc_op_request {
            kind: req.kind as i32,
            reduce: req.reduce.map_or(sys::DC_REDUCE_NONE, |r| r as i32),
            root: req.root,
            devices: refs.as_ptr(),
            n_devices: refs.len(),
            tensor: tensor.as_ptr(),
            output_tensor: opt_ptr(&output),
            timeout_ms: req.timeout_ms,
            dry_run,
        };
        let mut out = Owned::new(sys::dc_op_result_free);
        self.call(|c, st| unsafe { sys::dc_submit(c, &raw, &mut out.ptr, st) })?;
        out.get().map(OpResult::from_raw).ok_or_else(|| Error::new(Code::Internal, "dc_submit gave no result"))
    }

    /// Checks and plans `req` without running it: the concrete devices and the plan, or the
    /// server's refusal (e.g. `INVALID_ARGUMENT: autodiff should not wrap an autodiff
    /// device: ...`).
    pub fn plan(&self, req: &OpRequest) -> Result<OpResult> {
        self.run(req, true)
    }

    /// Runs `req` and waits for it; a refused or failed op is its `Err`.
    pub fn submit(&self, req: &OpRequest) -> Result<OpResult> {
        self.run(req, false)
    }

    /// One op by id.
    pub fn get_op(&self, op_id: &str) -> Result<OpResult> {
        let id = cstring(op_id)?;
        let mut out = Owned::new(sys::dc_op_result_free);
        self.call(|c, st| unsafe { sys::dc_get_op(c, id.as_ptr(), &mut out.ptr, st) })?;
        out.get().map(OpResult::from_raw).ok_or_else(|| Error::new(Code::Internal, "dc_get_op gave no result"))
    }

    /// Recent and in-flight ops, newest first (limit 0: the server's default).
    pub fn list_ops(&self, limit: u32) -> Result<Vec<OpResult>> {
        let mut out = Owned::new(sys::dc_op_list_free);
        self.call(|c, st| unsafe { sys::dc_list_ops(c, limit, &mut out.ptr, st) })?;
        Ok(out.get().map_or(vec![], |l| slice(l.ops, l.n).iter().map(OpResult::from_raw).collect()))
    }

    /// Stores `data` as the 1-D tensor `name` on `device` (cluster name, `"node-a/cuda:0"`).
    pub fn put<T: Element>(&self, device: &str, name: &str, data: &[T]) -> Result<()> {
        self.put_shaped(device, name, &[data.len() as u64], data)
    }

    /// Stores `data` (row-major) as tensor `name` of `shape` on `device`; the library checks
    /// that the shape matches the data's size.
    pub fn put_shaped<T: Element>(&self, device: &str, name: &str, shape: &[u64], data: &[T]) -> Result<()> {
        let (d, n) = (cstring(device)?, cstring(name)?);
        self.call(|c, st| unsafe {
            sys::dc_tensor_put(
                c,
                d.as_ptr(),
                n.as_ptr(),
                T::DTYPE,
                shape.as_ptr(),
                shape.len(),
                data.as_ptr() as *const c_void,
                std::mem::size_of_val(data),
                st,
            )
        })
    }

    /// Reads tensor `name` from `device` as elements of `T`; `INVALID_ARGUMENT` when the
    /// tensor holds another dtype.
    pub fn get<T: Element>(&self, device: &str, name: &str) -> Result<Tensor<T>> {
        let (d, n) = (cstring(device)?, cstring(name)?);
        let mut out = Owned::new(sys::dc_tensor_free);
        self.call(|c, st| unsafe { sys::dc_tensor_get(c, d.as_ptr(), n.as_ptr(), &mut out.ptr, st) })?;
        let t = out.get().ok_or_else(|| Error::new(Code::Internal, "dc_tensor_get gave no tensor"))?;
        if t.dtype != T::DTYPE {
            return Err(Error::new(
                Code::InvalidArgument,
                format!(
                    "tensor {} on {} holds {}, not {}",
                    name,
                    device,
                    self::name(sys::dc_dtype_name, t.dtype),
                    self::name(sys::dc_dtype_name, T::DTYPE)
                ),
            ));
        }
        let count = t.size_bytes / std::mem::size_of::<T>();
        let mut data = vec![T::default(); count];
        if count > 0 {
            // SAFETY: the tensor holds size_bytes bytes of T in native order; copying bytes
            // avoids assuming the library's buffer is aligned for T.
            unsafe { ptr::copy_nonoverlapping(t.data as *const u8, data.as_mut_ptr() as *mut u8, count * std::mem::size_of::<T>()) };
        }
        Ok(Tensor { shape: t.shape[..t.ndim.min(sys::DC_TENSOR_MAX_DIMS)].to_vec(), data })
    }

    /// Deletes tensor `name` from `device`.
    pub fn delete(&self, device: &str, name: &str) -> Result<()> {
        let (d, n) = (cstring(device)?, cstring(name)?);
        self.call(|c, st| unsafe { sys::dc_tensor_delete(c, d.as_ptr(), n.as_ptr(), st) })
    }

    /// The tensors stored on `device`.
    pub fn tensors(&self, device: &str) -> Result<Vec<TensorInfo>> {
        let d = cstring(device)?;
        let mut out = Owned::new(sys::dc_tensor_list_free);
        self.call(|c, st| unsafe { sys::dc_tensor_list_get(c, d.as_ptr(), &mut out.ptr, st) })?;
        Ok(out.get().map_or(vec![], |l| {
            slice(l.tensors, l.n)
                .iter()
                .map(|t| TensorInfo {
                    device: cstr_array(&t.device),
                    name: cstr_array(&t.name),
                    dtype: name(sys::dc_dtype_name, t.dtype),
                    shape: t.shape[..t.ndim.min(sys::DC_TENSOR_MAX_DIMS)].to_vec(),
                    size_bytes: t.size_bytes,
                })
                .collect()
        }))
    }
}

/// libdevcoord's version, `"0.3.0"`.
pub fn version() -> String {
    // SAFETY: a static string.
    cstr_ptr(unsafe { sys::dc_version() })
}
