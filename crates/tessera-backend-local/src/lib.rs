//! # tessera-backend-local
//!
//! The `local` backend: this machine's NVIDIA GPUs through NVML, and workloads as local
//! processes (`tessera serve --backend local`).
//!
//! * [`nvml`]: the NVML layer behind a trait. [`RealNvml`] uses `nvml-wrapper` 0.13 and raw
//!   NVML (`Nvml::lib()`) for GPU/compute instance listing, creation at an explicit placement and
//!   destruction; [`FakeNvml`] is for tests and the documented `--fake-gpus N` mode (GPUs in
//!   memory, real processes).
//! * [`discovery`]: GPUs, UUIDs, PCI, catalogue model (unknown models served as whole GPUs), MIG
//!   mode, existing GPU instances (adopted at start-up and never destroyed), NVLink peers.
//! * [`process`]: a workload is a process in its own process group and its own cgroup
//!   ([`cgroup`]: v2, or the v1 cpu, cpuacct, memory, pids, devices and freezer hierarchies, with
//!   its CPU, memory, pids and GPU device limits), as its own unprivileged user in its own 0700
//!   directory ([`isolation`]), with `CUDA_VISIBLE_DEVICES` set to its GPU or MIG UUIDs, output
//!   relayed by the server into a capped `DATA_DIR/workloads/ID/log` (the data directory is the
//!   server's alone); a restarted control plane adopts live workloads by their cgroups; stop =
//!   SIGTERM to every process of the cgroup, then freeze and SIGKILL after the grace.
//! * [`sandbox`]: where the host allows it, each workload in a mount namespace of its own: a
//!   read-only root, private `/tmp`, `/var/tmp` and `/dev/shm`, the data directory covered and
//!   only its own directory visible in the work directory.
//! * [`oci`] and [`cdi`]: a workload that names an image runs as a container from a local OCI
//!   image layout (`--local-images`), through runc or crun, in its own pid, mount, IPC, UTS and
//!   network namespaces and the same cgroup, as its own user; GPUs through the NVIDIA Container
//!   Toolkit's CDI spec where one is installed.
//! * [`LocalBackend`]: the backend contract (`Instance` partitioning at the engine's placement,
//!   only on GPUs an admin put in MIG mode — it never switches MIG mode; `Exact` devices; logs),
//!   telemetry every interval and critical XIDs as `GpuHealth` events as soon as NVML reports
//!   them.

mod backend;
pub mod cdi;
pub mod cgroup;
pub mod devfilter;
pub mod discovery;
mod fake;
pub mod isolation;
pub mod nvml;
pub mod oci;
pub mod process;
mod real;
pub mod sandbox;

pub use backend::{LocalBackend, LocalConfig};
pub use discovery::{DiscoveredGpu, Discovery, discover, fleet_toml};
pub use fake::{FakeGpu, FakeNvml, fake_bus_id};
pub use isolation::RunAs;
pub use nvml::{GpuInfo, GpuInstance, Nvml, NvmlError, Sample, XidEvent, xid_is_critical};
pub use oci::{ContainerConfig, ContainerNetwork};
pub use real::RealNvml;
pub use sandbox::SandboxMode;
