//! Safe Rust client of devcoord, the device coordination service for distributed training,
//! over libdevcoord (crate `devcoord-sys`).
//!
//! ```no_run
//! use devcoord::{Client, Device, OpRequest, ReduceOp};
//!
//! let client = Client::connect("tcp://127.0.0.1:7400")?;
//! client.put("node-a/cuda:0", "grad", &[1.0f32, 2.0])?;
//! client.put("node-b/cuda:0", "grad", &[3.0f32, 4.0])?;
//! let devices = vec![Device::Cuda(0).on("node-a"), Device::Cuda(0).on("node-b")];
//! client.submit(&OpRequest::all_reduce(devices, "grad", ReduceOp::Sum))?;
//! assert_eq!(client.get::<f32>("node-a/cuda:0", "grad")?.data, vec![4.0, 6.0]);
//! # Ok::<(), devcoord::Error>(())
//! ```
//!
//! Every call returns [`Result`]; a failure is an [`Error`] with a gRPC-style [`Code`] and the
//! server's message, never a panic. Linking: `devcoord-sys` finds libdevcoord through
//! `$DEVCOORD_LIB_DIR` or `pkg-config devcoord`.

#![deny(missing_docs)]

mod client;
mod device;
mod error;
mod group;
mod half;

pub use client::{
    version, Client, ClusterStatus, DeviceInfo, Element, OpKind, OpRequest, OpResult, Options, PlanWorker, ReduceOp, Tensor,
    TensorInfo, Worker, WorkerResult,
};
pub use device::{Device, DeviceRef, LibTorchKind, WgpuKind};
pub use error::{Code, Error, Result};
pub use group::{Group, GroupOptions, Request, Scope, SharedBuf};
pub use half::{BF16, F16};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_text_round_trips_through_the_c_parser() {
        let cases = vec![
            (Device::Cpu, "cpu:0"),
            (Device::Cuda(3), "cuda:3"),
            (Device::Rocm(1), "rocm:1"),
            (Device::Metal(WgpuKind::Integrated, 0), "metal:integrated:0"),
            (Device::Vulkan(WgpuKind::Default, 2), "vulkan:default:2"),
            (Device::Wgpu(WgpuKind::Discrete, 1), "wgpu:discrete:1"),
            (Device::WebGpu(WgpuKind::Cpu, 0), "webgpu:cpu:0"),
            (Device::Flex, "flex:0"),
            (Device::NdArray, "ndarray:0"),
            (Device::LibTorch(LibTorchKind::Mps, 0), "libtorch:mps:0"),
            (Device::Remote(4), "remote:4"),
            (Device::Cuda(0).autodiff().autodiff(), "autodiff(autodiff(cuda:0))"),
        ];
        for (d, text) in cases {
            assert_eq!(d.to_string(), text);
            assert_eq!(text.parse::<Device>().unwrap(), d, "{}", text);
        }
        let r = Device::Rocm(1).autodiff().on("node-a");
        assert_eq!(r.to_string(), "node-a/autodiff(rocm:1)");
        assert_eq!("node-a/autodiff(rocm:1)".parse::<DeviceRef>().unwrap(), r);
        // the parser fills in defaults: "wgpu" is wgpu:default:0, "libtorch" libtorch:cpu:0
        assert_eq!("wgpu".parse::<Device>().unwrap(), Device::Wgpu(WgpuKind::Default, 0));
        assert_eq!("libtorch:1".parse::<Device>().unwrap(), Device::LibTorch(LibTorchKind::Cpu, 1));
    }

    #[test]
    fn bad_text_is_an_error_not_a_panic() {
        let e = "cuda:(".parse::<Device>().unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.to_string().starts_with("INVALID_ARGUMENT: expected"), "{}", e);
        let deep = (0..40).fold(Device::Cuda(0), |d, _| d.autodiff());
        assert_eq!(deep.to_string().parse::<Device>().unwrap_err().code, Code::InvalidArgument);
        assert_eq!("cpu:1".parse::<Device>().unwrap_err().code, Code::InvalidArgument);
        assert_eq!(Code::from_raw(5), Code::NotFound);
        assert_eq!(Code::from_raw(99).name(), "UNKNOWN");
        assert_eq!(Code::DeadlineExceeded.name(), "DEADLINE_EXCEEDED");
    }

    #[test]
    fn client_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Client>();
        fn send<T: Send>() {}
        send::<Group<'static>>();
    }
}
