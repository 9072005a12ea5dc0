//! Raw declarations of libdevcoord's public C API (`include/devcoord/devcoord.h`, `types.h`,
//! `status.h`), written by hand. Every struct is `#[repr(C)]` and mirrors its C definition
//! field for field; C enums are `c_int` aliases with the header's constants. Use the safe
//! crate `devcoord` instead of calling these directly.
//!
//! Linking: the build script uses `$DEVCOORD_LIB_DIR` when set, else `pkg-config --libs
//! devcoord`.
#![allow(non_camel_case_types)]
#![deny(missing_docs)]

use std::os::raw::{c_char, c_int, c_void};

/// Status code (gRPC's canonical codes, `dc_code`).
pub type dc_code = c_int;
/// Backend of a device (`dc_backend`).
pub type dc_backend = c_int;
/// Kind of a wgpu-family or libtorch device (`dc_kind`).
pub type dc_kind = c_int;
/// Operation kind (`dc_op_kind`).
pub type dc_op_kind = c_int;
/// Reduce operation (`dc_reduce_op`).
pub type dc_reduce_op = c_int;
/// Tensor element type (`dc_dtype`).
pub type dc_dtype = c_int;
/// Registry state of a worker (`dc_worker_state`).
pub type dc_worker_state = c_int;
/// Registry state of a device (`dc_device_state`).
pub type dc_device_state = c_int;
/// State of an operation (`dc_op_state`).
pub type dc_op_state = c_int;

/// Characters of a worker name, without the NUL.
pub const DC_WORKER_NAME_MAX: usize = 63;
/// Bytes a device reference may take in text, plus the NUL.
pub const DC_DEVICE_TEXT_SIZE: usize = 257;
/// Dimensions a tensor may have.
pub const DC_TENSOR_MAX_DIMS: usize = 8;
/// Size of `dc_status.message`.
pub const DC_STATUS_MESSAGE_MAX: usize = 1024;
/// Size of `dc_status.worker`.
pub const DC_STATUS_WORKER_MAX: usize = 64;
/// Number of `dc_backend` values (including NONE).
pub const DC_BACKEND_COUNT: usize = 12;

/// `dc_backend` values.
pub const DC_BACKEND_NONE: dc_backend = 0;
/// `DC_BACKEND_CPU` of the C headers.
pub const DC_BACKEND_CPU: dc_backend = 1;
/// `DC_BACKEND_CUDA` of the C headers.
pub const DC_BACKEND_CUDA: dc_backend = 2;
/// `DC_BACKEND_ROCM` of the C headers.
pub const DC_BACKEND_ROCM: dc_backend = 3;
/// `DC_BACKEND_METAL` of the C headers.
pub const DC_BACKEND_METAL: dc_backend = 4;
/// `DC_BACKEND_VULKAN` of the C headers.
pub const DC_BACKEND_VULKAN: dc_backend = 5;
/// `DC_BACKEND_WGPU` of the C headers.
pub const DC_BACKEND_WGPU: dc_backend = 6;
/// `DC_BACKEND_WEBGPU` of the C headers.
pub const DC_BACKEND_WEBGPU: dc_backend = 7;
/// `DC_BACKEND_FLEX` of the C headers.
pub const DC_BACKEND_FLEX: dc_backend = 8;
/// `DC_BACKEND_NDARRAY` of the C headers.
pub const DC_BACKEND_NDARRAY: dc_backend = 9;
/// `DC_BACKEND_LIBTORCH` of the C headers.
pub const DC_BACKEND_LIBTORCH: dc_backend = 10;
/// `DC_BACKEND_REMOTE` of the C headers.
pub const DC_BACKEND_REMOTE: dc_backend = 11;

/// `dc_kind` values.
pub const DC_KIND_NONE: dc_kind = 0;
/// `DC_KIND_DISCRETE` of the C headers.
pub const DC_KIND_DISCRETE: dc_kind = 1;
/// `DC_KIND_INTEGRATED` of the C headers.
pub const DC_KIND_INTEGRATED: dc_kind = 2;
/// `DC_KIND_VIRTUAL` of the C headers.
pub const DC_KIND_VIRTUAL: dc_kind = 3;
/// `DC_KIND_CPU` of the C headers.
pub const DC_KIND_CPU: dc_kind = 4;
/// `DC_KIND_DEFAULT` of the C headers.
pub const DC_KIND_DEFAULT: dc_kind = 5;
/// `DC_KIND_CUDA` of the C headers.
pub const DC_KIND_CUDA: dc_kind = 6;
/// `DC_KIND_MPS` of the C headers.
pub const DC_KIND_MPS: dc_kind = 7;
/// `DC_KIND_VULKAN` of the C headers.
pub const DC_KIND_VULKAN: dc_kind = 8;

/// `dc_op_kind` values.
pub const DC_OP_ALL_REDUCE: dc_op_kind = 1;
/// `DC_OP_REDUCE` of the C headers.
pub const DC_OP_REDUCE: dc_op_kind = 2;
/// `DC_OP_BROADCAST` of the C headers.
pub const DC_OP_BROADCAST: dc_op_kind = 3;
/// `DC_OP_ALL_GATHER` of the C headers.
pub const DC_OP_ALL_GATHER: dc_op_kind = 4;
/// `DC_OP_BARRIER` of the C headers.
pub const DC_OP_BARRIER: dc_op_kind = 5;

/// `dc_reduce_op` values.
pub const DC_REDUCE_NONE: dc_reduce_op = 0;
/// `DC_REDUCE_SUM` of the C headers.
pub const DC_REDUCE_SUM: dc_reduce_op = 1;
/// `DC_REDUCE_MEAN` of the C headers.
pub const DC_REDUCE_MEAN: dc_reduce_op = 2;
/// `DC_REDUCE_MIN` of the C headers.
pub const DC_REDUCE_MIN: dc_reduce_op = 3;
/// `DC_REDUCE_MAX` of the C headers.
pub const DC_REDUCE_MAX: dc_reduce_op = 4;
/// `DC_REDUCE_PROD` of the C headers.
pub const DC_REDUCE_PROD: dc_reduce_op = 5;

/// `DC_DTYPE_F32` of the C headers.
pub const DC_DTYPE_F32: dc_dtype = 1;
/// `DC_DTYPE_F64` of the C headers.
pub const DC_DTYPE_F64: dc_dtype = 2;
/// `DC_DTYPE_I32` of the C headers.
pub const DC_DTYPE_I32: dc_dtype = 3;
/// `DC_DTYPE_I64` of the C headers.
pub const DC_DTYPE_I64: dc_dtype = 4;
/// `DC_DTYPE_F16` of the C headers (IEEE 754 binary16, reduced in float).
pub const DC_DTYPE_F16: dc_dtype = 5;
/// `DC_DTYPE_BF16` of the C headers (bfloat16, reduced in float).
pub const DC_DTYPE_BF16: dc_dtype = 6;

/// Opaque client handle (`dc_client`); safe to use from many threads at once.
#[repr(C)]
pub struct dc_client {
    _private: [u8; 0],
}

/// `dc_status`: code, whether no answer came (transport), offending device index, worker
/// and message.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_status {
    pub code: dc_code,
    pub transport: bool,
    pub device_index: i32,
    pub worker: [c_char; DC_STATUS_WORKER_MAX],
    pub message: [c_char; DC_STATUS_MESSAGE_MAX],
}

/// `dc_client_options`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_client_options {
    pub token: *const c_char,
    pub token_file: *const c_char,
    pub timeout_ms: u32,
    pub fail_fast: bool,
    pub tls_ca: *const c_char,
    pub tls_cert: *const c_char,
    pub tls_key: *const c_char,
    pub tls_server_name: *const c_char,
}

/// `dc_label`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_label {
    pub key: *mut c_char,
    pub value: *mut c_char,
}

/// `dc_worker_info`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_worker_info {
    pub name: [c_char; DC_WORKER_NAME_MAX + 1],
    pub address: [c_char; 256],
    pub state: dc_worker_state,
    pub epoch: u64,
    pub device_count: u32,
    pub executor: [c_char; 32],
    pub since_heartbeat_ms: u64,
    pub max_message_bytes: u64,
    pub n_labels: usize,
    pub labels: *mut dc_label,
}

/// `dc_worker_list`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_worker_list {
    pub n: usize,
    pub workers: *mut dc_worker_info,
}

/// `dc_device`: a concrete device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_device {
    pub backend: dc_backend,
    pub kind: dc_kind,
    pub index: u32,
}

/// `dc_device_info`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_device_info {
    pub name: *const c_char,
    pub worker: *const c_char,
    pub device: dc_device,
    pub state: dc_device_state,
    pub memory_bytes: u64,
}

/// `dc_device_list`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_device_list {
    pub n: usize,
    pub devices: *mut dc_device_info,
}

/// `dc_device_filter`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_device_filter {
    pub backend: dc_backend,
    pub worker: *const c_char,
    pub state: dc_device_state,
    pub label: *const c_char,
}

/// `dc_cluster_status`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_cluster_status {
    pub workers_alive: u32,
    pub workers_dead: u32,
    pub workers_cordoned: u32,
    pub workers_draining: u32,
    pub devices_by_backend: [u32; DC_BACKEND_COUNT],
    pub ops_in_flight: u64,
    pub ops_done: u64,
    pub ops_failed: u64,
    pub ready: bool,
}

/// `dc_device_ref`: optional worker ("" when not named), device, autodiff depth.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_device_ref {
    pub worker: [c_char; DC_WORKER_NAME_MAX + 1],
    pub device: dc_device,
    pub autodiff_depth: u32,
}

/// `dc_op_request`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_op_request {
    pub kind: dc_op_kind,
    pub reduce: dc_reduce_op,
    pub root: u32,
    pub devices: *const dc_device_ref,
    pub n_devices: usize,
    pub tensor: *const c_char,
    pub output_tensor: *const c_char,
    pub timeout_ms: u32,
    pub dry_run: bool,
}

/// `dc_plan_worker`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_plan_worker {
    pub name: [c_char; DC_WORKER_NAME_MAX + 1],
    pub address: [c_char; 256],
    pub n_ranks: usize,
    pub ranks: *mut u32,
}

/// `dc_worker_result`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_worker_result {
    pub name: [c_char; DC_WORKER_NAME_MAX + 1],
    pub code: dc_code,
    pub message: [c_char; DC_STATUS_MESSAGE_MAX],
    pub elapsed_us: u64,
}

/// `dc_op_result`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_op_result {
    pub op_id: [c_char; 40],
    pub kind: dc_op_kind,
    pub reduce: dc_reduce_op,
    pub root: u32,
    pub tensor: [c_char; 256],
    pub output_tensor: [c_char; 256],
    pub state: dc_op_state,
    pub status: dc_status,
    pub group_id: [c_char; 17],
    pub n_devices: usize,
    pub devices: *mut dc_device_ref,
    pub n_plan_workers: usize,
    pub plan_workers: *mut dc_plan_worker,
    pub n_results: usize,
    pub results: *mut dc_worker_result,
    pub n_waiting: usize,
    pub waiting_on: *mut [c_char; DC_WORKER_NAME_MAX + 1],
    pub submitted_unix_ms: u64,
    pub elapsed_us: u64,
}

/// `dc_op_list`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_op_list {
    pub n: usize,
    pub ops: *mut dc_op_result,
}

/// `dc_tensor`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_tensor {
    pub device: [c_char; DC_DEVICE_TEXT_SIZE],
    pub name: [c_char; 256],
    pub dtype: dc_dtype,
    pub ndim: usize,
    pub shape: [u64; DC_TENSOR_MAX_DIMS],
    pub size_bytes: usize,
    pub data: *mut c_void,
}

/// `dc_tensor_list`.
#[repr(C)]
#[allow(missing_docs)] // fields as the C struct's
pub struct dc_tensor_list {
    pub n: usize,
    pub tensors: *mut dc_tensor,
}

/// Opaque group membership (`dc_group`).
#[repr(C)]
pub struct dc_group {
    _private: [u8; 0],
}

/// Opaque call in flight (`dc_request`).
#[repr(C)]
pub struct dc_request {
    _private: [u8; 0],
}

/// `dc_group_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct dc_group_options {
    /// How long the join waits for every rank (0: the coordinator's limit).
    pub timeout_ms: u32,
    /// How long each call waits for every rank (0: 30000).
    pub call_timeout_ms: u32,
}

/// `dc_progress_fn`.
pub type dc_progress_fn = Option<unsafe extern "C" fn(done: usize, total: usize, arg: *mut c_void)>;

#[link(name = "devcoord")]
extern "C" {
    /// `dc_version` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_version() -> *const c_char;
    /// `dc_status_name` of `include/devcoord/status.h`, whose comment documents it.
    pub fn dc_status_name(code: dc_code) -> *const c_char;
    /// `dc_status_from_name` of `include/devcoord/status.h`, whose comment documents it.
    pub fn dc_status_from_name(name: *const c_char) -> c_int;

    /// `dc_client_open` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_client_open(
        address: *const c_char,
        opts: *const dc_client_options,
        out: *mut *mut dc_client,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_client_close` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_client_close(c: *mut dc_client);

    /// `dc_list_workers` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_list_workers(c: *mut dc_client, out: *mut *mut dc_worker_list, st: *mut dc_status) -> dc_code;
    /// `dc_worker_list_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_worker_list_free(list: *mut dc_worker_list);
    /// `dc_list_devices` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_list_devices(
        c: *mut dc_client,
        filter: *const dc_device_filter,
        out: *mut *mut dc_device_list,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_device_list_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_device_list_free(list: *mut dc_device_list);
    /// `dc_get_device` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_get_device(c: *mut dc_client, name: *const c_char, out: *mut dc_device_info, st: *mut dc_status) -> dc_code;
    /// `dc_device_info_clear` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_device_info_clear(d: *mut dc_device_info);
    /// `dc_cordon_worker` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_cordon_worker(c: *mut dc_client, name: *const c_char, out: *mut dc_worker_info, st: *mut dc_status) -> dc_code;
    /// `dc_uncordon_worker` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_uncordon_worker(c: *mut dc_client, name: *const c_char, out: *mut dc_worker_info, st: *mut dc_status) -> dc_code;
    /// `dc_drain_worker` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_drain_worker(c: *mut dc_client, name: *const c_char, out: *mut dc_worker_info, st: *mut dc_status) -> dc_code;
    /// `dc_worker_info_clear` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_worker_info_clear(w: *mut dc_worker_info);
    /// `dc_cluster_status_get` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_cluster_status_get(c: *mut dc_client, out: *mut dc_cluster_status, st: *mut dc_status) -> dc_code;
    /// `dc_health` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_health(c: *mut dc_client, st: *mut dc_status) -> dc_code;

    /// `dc_op_state_name` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_op_state_name(state: dc_op_state) -> *const c_char;
    /// `dc_submit` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_submit(c: *mut dc_client, req: *const dc_op_request, out: *mut *mut dc_op_result, st: *mut dc_status) -> dc_code;
    /// `dc_get_op` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_get_op(c: *mut dc_client, op_id: *const c_char, out: *mut *mut dc_op_result, st: *mut dc_status) -> dc_code;
    /// `dc_op_result_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_op_result_free(r: *mut dc_op_result);
    /// `dc_list_ops` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_list_ops(c: *mut dc_client, limit: u32, out: *mut *mut dc_op_list, st: *mut dc_status) -> dc_code;
    /// `dc_op_list_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_op_list_free(list: *mut dc_op_list);
    /// `dc_device_list_parse` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_device_list_parse(text: *const c_char, out: *mut *mut dc_device_ref, n: *mut usize, st: *mut dc_status) -> dc_code;

    /// `dc_tensor_put` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_put(
        c: *mut dc_client,
        device: *const c_char,
        name: *const c_char,
        dtype: dc_dtype,
        shape: *const u64,
        ndim: usize,
        data: *const c_void,
        bytes: usize,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_tensor_get` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_get(c: *mut dc_client, device: *const c_char, name: *const c_char, out: *mut *mut dc_tensor, st: *mut dc_status) -> dc_code;
    /// `dc_tensor_put_progress` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_put_progress(
        c: *mut dc_client,
        device: *const c_char,
        name: *const c_char,
        dtype: dc_dtype,
        shape: *const u64,
        ndim: usize,
        data: *const c_void,
        bytes: usize,
        progress: dc_progress_fn,
        arg: *mut c_void,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_tensor_get_progress` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_get_progress(
        c: *mut dc_client,
        device: *const c_char,
        name: *const c_char,
        out: *mut *mut dc_tensor,
        progress: dc_progress_fn,
        arg: *mut c_void,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_tensor_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_free(t: *mut dc_tensor);
    /// `dc_tensor_delete` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_delete(c: *mut dc_client, device: *const c_char, name: *const c_char, st: *mut dc_status) -> dc_code;
    /// `dc_tensor_list_get` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_list_get(c: *mut dc_client, device: *const c_char, out: *mut *mut dc_tensor_list, st: *mut dc_status) -> dc_code;
    /// `dc_tensor_list_free` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_tensor_list_free(list: *mut dc_tensor_list);

    /// `dc_device_ref_parse` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_device_ref_parse(text: *const c_char, len: usize, out: *mut dc_device_ref, st: *mut dc_status) -> dc_code;
    /// `dc_device_ref_format` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_device_ref_format(r: *const dc_device_ref, buf: *mut c_char, cap: usize) -> usize;
    /// `dc_device_format` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_device_format(dev: *const dc_device, buf: *mut c_char, cap: usize) -> usize;
    /// `dc_backend_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_backend_name(backend: dc_backend) -> *const c_char;
    /// `dc_backend_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_backend_from_name(name: *const c_char) -> dc_backend;
    /// `dc_kind_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_kind_name(kind: dc_kind) -> *const c_char;
    /// `dc_op_kind_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_op_kind_name(kind: dc_op_kind) -> *const c_char;
    /// `dc_op_kind_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_op_kind_from_name(name: *const c_char) -> dc_op_kind;
    /// `dc_reduce_op_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_reduce_op_name(op: dc_reduce_op) -> *const c_char;
    /// `dc_reduce_op_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_reduce_op_from_name(name: *const c_char) -> dc_reduce_op;
    /// `dc_dtype_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_dtype_name(dtype: dc_dtype) -> *const c_char;
    /// `dc_dtype_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_dtype_from_name(name: *const c_char) -> dc_dtype;
    /// `dc_dtype_size` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_dtype_size(dtype: dc_dtype) -> usize;
    /// `dc_worker_state_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_worker_state_name(state: dc_worker_state) -> *const c_char;
    /// `dc_worker_state_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_worker_state_from_name(name: *const c_char) -> dc_worker_state;
    /// `dc_device_state_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_device_state_name(state: dc_device_state) -> *const c_char;
    /// `dc_device_state_from_name` of `include/devcoord/types.h`, whose comment documents it.
    pub fn dc_device_state_from_name(name: *const c_char) -> dc_device_state;
    /// `dc_group_join` of `include/devcoord/devcoord.h`, whose comment documents it.
    pub fn dc_group_join(
        c: *mut dc_client,
        devices: *const c_char,
        self_: *const c_char,
        opts: *const dc_group_options,
        out: *mut *mut dc_group,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_group_rank`.
    pub fn dc_group_rank(g: *const dc_group) -> u32;
    /// `dc_group_size`.
    pub fn dc_group_size(g: *const dc_group) -> u32;
    /// `dc_group_id`.
    pub fn dc_group_id(g: *const dc_group) -> *const c_char;
    /// `dc_group_generation`.
    pub fn dc_group_generation(g: *const dc_group) -> u64;
    /// `dc_group_device`.
    pub fn dc_group_device(g: *const dc_group, rank: u32) -> *const c_char;
    /// `dc_group_leave`.
    pub fn dc_group_leave(g: *mut dc_group, st: *mut dc_status) -> dc_code;
    /// `dc_f16_to_float`.
    pub fn dc_f16_to_float(bits: u16) -> f32;
    /// `dc_float_to_f16`.
    pub fn dc_float_to_f16(value: f32) -> u16;
    /// `dc_bf16_to_float`.
    pub fn dc_bf16_to_float(bits: u16) -> f32;
    /// `dc_float_to_bf16`.
    pub fn dc_float_to_bf16(value: f32) -> u16;
    /// `dc_group_alloc`.
    pub fn dc_group_alloc(g: *mut dc_group, bytes: usize, st: *mut dc_status) -> *mut c_void;
    /// `dc_group_free`.
    pub fn dc_group_free(g: *mut dc_group, buf: *mut c_void);
    /// `dc_group_buffer_shared`.
    pub fn dc_group_buffer_shared(g: *mut dc_group, buf: *const c_void) -> bool;
    /// `dc_all_reduce`.
    pub fn dc_all_reduce(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_reduce`.
    pub fn dc_reduce(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        root: u32,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_broadcast`.
    pub fn dc_broadcast(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        root: u32,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_all_gather`.
    pub fn dc_all_gather(
        g: *mut dc_group,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_reduce_scatter`.
    pub fn dc_reduce_scatter(
        g: *mut dc_group,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        st: *mut dc_status,
    ) -> dc_code;
    /// `dc_barrier`.
    pub fn dc_barrier(g: *mut dc_group, st: *mut dc_status) -> dc_code;
    /// `dc_all_reduce_async`.
    pub fn dc_all_reduce_async(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        st: *mut dc_status,
    ) -> *mut dc_request;
    /// `dc_reduce_async`.
    pub fn dc_reduce_async(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        root: u32,
        st: *mut dc_status,
    ) -> *mut dc_request;
    /// `dc_broadcast_async`.
    pub fn dc_broadcast_async(
        g: *mut dc_group,
        buf: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        root: u32,
        st: *mut dc_status,
    ) -> *mut dc_request;
    /// `dc_all_gather_async`.
    pub fn dc_all_gather_async(
        g: *mut dc_group,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        st: *mut dc_status,
    ) -> *mut dc_request;
    /// `dc_reduce_scatter_async`.
    pub fn dc_reduce_scatter_async(
        g: *mut dc_group,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: dc_dtype,
        op: dc_reduce_op,
        st: *mut dc_status,
    ) -> *mut dc_request;
    /// `dc_barrier_async`.
    pub fn dc_barrier_async(g: *mut dc_group, st: *mut dc_status) -> *mut dc_request;
    /// `dc_wait`.
    pub fn dc_wait(req: *mut dc_request, st: *mut dc_status) -> dc_code;
    /// `dc_test`.
    pub fn dc_test(req: *mut dc_request, done: *mut bool, st: *mut dc_status) -> dc_code;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn version_and_names() {
        unsafe {
            assert_eq!(CStr::from_ptr(dc_version()).to_str().unwrap(), "0.3.0");
            assert_eq!(CStr::from_ptr(dc_status_name(3)).to_str().unwrap(), "INVALID_ARGUMENT");
            assert_eq!(CStr::from_ptr(dc_backend_name(DC_BACKEND_LIBTORCH)).to_str().unwrap(), "libtorch");
        }
    }
}
