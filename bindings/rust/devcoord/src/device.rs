//! [`Device`], shaped like burn's `DispatchDevice`, and [`DeviceRef`] (a device optionally on a
//! named worker), both formatting to the text form of the README's "Devices".

use std::fmt;
use std::str::FromStr;

use devcoord_sys as sys;

use crate::error::{Code, Error, Result};

/// Adapter kind of the wgpu family (wgpu, webgpu, vulkan, metal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WgpuKind {
    /// `discrete`
    Discrete,
    /// `integrated`
    Integrated,
    /// `virtual`
    Virtual,
    /// `cpu`
    Cpu,
    /// `default` (what the text form means when it names no kind)
    Default,
}

/// Device kind of libtorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LibTorchKind {
    /// `cuda`
    Cuda,
    /// `mps`
    Mps,
    /// `vulkan`
    Vulkan,
    /// `cpu` (the default)
    Cpu,
}

impl WgpuKind {
    fn name(self) -> &'static str {
        match self {
            WgpuKind::Discrete => "discrete",
            WgpuKind::Integrated => "integrated",
            WgpuKind::Virtual => "virtual",
            WgpuKind::Cpu => "cpu",
            WgpuKind::Default => "default",
        }
    }

    fn from_raw(kind: sys::dc_kind) -> Option<WgpuKind> {
        Some(match kind {
            sys::DC_KIND_DISCRETE => WgpuKind::Discrete,
            sys::DC_KIND_INTEGRATED => WgpuKind::Integrated,
            sys::DC_KIND_VIRTUAL => WgpuKind::Virtual,
            sys::DC_KIND_CPU => WgpuKind::Cpu,
            sys::DC_KIND_DEFAULT | sys::DC_KIND_NONE => WgpuKind::Default,
            _ => return None,
        })
    }
}

impl LibTorchKind {
    fn name(self) -> &'static str {
        match self {
            LibTorchKind::Cuda => "cuda",
            LibTorchKind::Mps => "mps",
            LibTorchKind::Vulkan => "vulkan",
            LibTorchKind::Cpu => "cpu",
        }
    }

    fn from_raw(kind: sys::dc_kind) -> Option<LibTorchKind> {
        Some(match kind {
            sys::DC_KIND_CUDA => LibTorchKind::Cuda,
            sys::DC_KIND_MPS => LibTorchKind::Mps,
            sys::DC_KIND_VULKAN => LibTorchKind::Vulkan,
            sys::DC_KIND_CPU | sys::DC_KIND_NONE => LibTorchKind::Cpu,
            _ => return None,
        })
    }
}

/// A device as burn's `DispatchDevice` names it. Formats (`Display`) to the text form of
/// the README's "Devices": `Cuda(0)` is `cuda:0`, `Wgpu(WgpuKind::Discrete, 1)` is `wgpu:discrete:1`,
/// `Autodiff(Box::new(Cuda(0)))` is `autodiff(cuda:0)`. `Cpu`, `Flex` and `NdArray` are index
/// 0 (`cpu:0`, `flex:0`, `ndarray:0`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// `cpu:0`
    Cpu,
    /// `cuda:i`
    Cuda(u32),
    /// `rocm:i`
    Rocm(u32),
    /// `metal:kind:i`
    Metal(WgpuKind, u32),
    /// `vulkan:kind:i`
    Vulkan(WgpuKind, u32),
    /// `wgpu:kind:i`
    Wgpu(WgpuKind, u32),
    /// `webgpu:kind:i`
    WebGpu(WgpuKind, u32),
    /// `flex:0`
    Flex,
    /// `ndarray:0`
    NdArray,
    /// `libtorch:kind:i`
    LibTorch(LibTorchKind, u32),
    /// `remote:i`
    Remote(u32),
    /// `autodiff(inner)`: the autodiff decorator around another device.
    Autodiff(Box<Device>),
}

impl Device {
    /// This device on worker `worker` (`node-a/cuda:0`).
    pub fn on(self, worker: &str) -> DeviceRef {
        DeviceRef { worker: Some(worker.to_string()), device: self }
    }

    /// `Autodiff(Box::new(self))`.
    pub fn autodiff(self) -> Device {
        Device::Autodiff(Box::new(self))
    }

    /// The device of a C `dc_device` wrapped `depth` times in autodiff; an error for values
    /// this enum cannot hold (e.g. `cpu:1`, whose index `Cpu` has no room for).
    pub fn from_raw(dev: &sys::dc_device, depth: u32) -> Result<Device> {
        let wgpu = || WgpuKind::from_raw(dev.kind);
        let i = dev.index;
        let concrete = match (dev.backend, i) {
            (sys::DC_BACKEND_CPU, 0) => Some(Device::Cpu),
            (sys::DC_BACKEND_CUDA, _) => Some(Device::Cuda(i)),
            (sys::DC_BACKEND_ROCM, _) => Some(Device::Rocm(i)),
            (sys::DC_BACKEND_METAL, _) => wgpu().map(|k| Device::Metal(k, i)),
            (sys::DC_BACKEND_VULKAN, _) => wgpu().map(|k| Device::Vulkan(k, i)),
            (sys::DC_BACKEND_WGPU, _) => wgpu().map(|k| Device::Wgpu(k, i)),
            (sys::DC_BACKEND_WEBGPU, _) => wgpu().map(|k| Device::WebGpu(k, i)),
            (sys::DC_BACKEND_FLEX, 0) => Some(Device::Flex),
            (sys::DC_BACKEND_NDARRAY, 0) => Some(Device::NdArray),
            (sys::DC_BACKEND_LIBTORCH, _) => LibTorchKind::from_raw(dev.kind).map(|k| Device::LibTorch(k, i)),
            (sys::DC_BACKEND_REMOTE, _) => Some(Device::Remote(i)),
            _ => None,
        };
        let mut d = concrete.ok_or_else(|| {
            Error::new(
                Code::InvalidArgument,
                format!("device {} has no devcoord::Device form", crate::client::device_text(dev)),
            )
        })?;
        for _ in 0..depth {
            d = d.autodiff();
        }
        Ok(d)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu:0"),
            Device::Cuda(i) => write!(f, "cuda:{}", i),
            Device::Rocm(i) => write!(f, "rocm:{}", i),
            Device::Metal(k, i) => write!(f, "metal:{}:{}", k.name(), i),
            Device::Vulkan(k, i) => write!(f, "vulkan:{}:{}", k.name(), i),
            Device::Wgpu(k, i) => write!(f, "wgpu:{}:{}", k.name(), i),
            Device::WebGpu(k, i) => write!(f, "webgpu:{}:{}", k.name(), i),
            Device::Flex => f.write_str("flex:0"),
            Device::NdArray => f.write_str("ndarray:0"),
            Device::LibTorch(k, i) => write!(f, "libtorch:{}:{}", k.name(), i),
            Device::Remote(i) => write!(f, "remote:{}", i),
            Device::Autodiff(inner) => write!(f, "autodiff({})", inner),
        }
    }
}

/// A device, optionally on a named worker: what op device lists hold. Displays as
/// `node-a/autodiff(cuda:0)` (or without `worker/` when no worker is named).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRef {
    /// The owning worker, when named.
    pub worker: Option<String>,
    /// The device.
    pub device: Device,
}

impl DeviceRef {
    /// The C form, parsed from the text form by libdevcoord (so any text the library refuses
    /// is an `InvalidArgument` error, never a panic).
    pub(crate) fn to_raw(&self) -> Result<sys::dc_device_ref> {
        crate::client::parse_ref(&self.to_string())
    }

    /// The reference of a C `dc_device_ref`.
    pub fn from_raw(r: &sys::dc_device_ref) -> Result<DeviceRef> {
        let worker = crate::client::cstr_array(&r.worker);
        Ok(DeviceRef {
            worker: if worker.is_empty() { None } else { Some(worker) },
            device: Device::from_raw(&r.device, r.autodiff_depth)?,
        })
    }
}

impl From<Device> for DeviceRef {
    fn from(device: Device) -> DeviceRef {
        DeviceRef { worker: None, device }
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(w) = &self.worker {
            write!(f, "{}/", w)?;
        }
        write!(f, "{}", self.device)
    }
}

impl FromStr for DeviceRef {
    type Err = Error;

    /// Parses the text form (`"node-a/autodiff(cuda)"`) with libdevcoord's parser.
    fn from_str(s: &str) -> Result<DeviceRef> {
        DeviceRef::from_raw(&crate::client::parse_ref(s)?)
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses a device without a worker (`"wgpu:discrete:1"`).
    fn from_str(s: &str) -> Result<Device> {
        let r: DeviceRef = s.parse()?;
        match r.worker {
            None => Ok(r.device),
            Some(_) => Err(Error::new(Code::InvalidArgument, format!("{} names a worker; parse a DeviceRef", s))),
        }
    }
}
