//! Device binding: checks exact devices (exact mode), or picks devices for a count of a
//! resource as the kubelet and NVIDIA's device plugin would (operator mode).

use tessera_backend::{BackendError, Bound, Devices, MigInstance, Resource, RunSpec, SliceSpec};

use crate::SimMode;
use crate::state::State;

/// Where a workload runs and what it holds.
pub(crate) struct Binding {
    /// Indices into the state's GPUs.
    pub gpus: Vec<usize>,
    pub slice: SliceSpec,
    /// What `Started` reports (operator mode only).
    pub bound: Option<Bound>,
}

fn rejected(msg: String) -> BackendError {
    BackendError::Rejected(msg)
}

/// Binds devices on `node` as `mode` binds a workload's: the checks of the devices themselves
/// (the node and GPUs exist, a MIG instance was partitioned, the simulated kubelet finds free
/// devices of the resource). Changes nothing.
pub(crate) fn bind_share(state: &State, mode: SimMode, node: &str, devices: &Devices) -> Result<Binding, BackendError> {
    match (mode, devices) {
        (SimMode::Exact, Devices::Exact { gpus, slice }) => exact(state, node, gpus, slice),
        (SimMode::Operator, Devices::Count { resource, count }) => by_count(state, node, resource, *count),
        (SimMode::Exact, Devices::Count { resource, .. }) => Err(rejected(format!(
            "the sim backend in exact mode is given exact devices, not a count of {resource}"
        ))),
        (SimMode::Operator, Devices::Exact { .. }) => Err(rejected(
            "the sim backend in operator mode is given a count of a resource, not exact devices: the kubelet picks them"
                .into(),
        )),
    }
}

/// Binds every node-share of `spec` for a start, each on its own node as a workload on one
/// node is bound, and in exact mode refuses devices another workload holds (operator mode
/// picks free ones only). Changes nothing, so a gang is bound whole or not at all; a gang's
/// refusal names the node-share and its node.
pub(crate) fn bind_start(state: &State, mode: SimMode, spec: &RunSpec) -> Result<Vec<Binding>, BackendError> {
    (0..spec.gang_size())
        .map(|i| {
            let (node, devices) = spec.share(i).expect("an index below the gang size");
            let binding = check_node(state, spec, i)
                .and_then(|()| bind_share(state, mode, node, devices))
                .and_then(|b| match mode {
                    SimMode::Exact => check_free(state, &b).map(|()| b),
                    SimMode::Operator => Ok(b),
                });
            binding.map_err(|e| in_share(spec, i, e))
        })
        .collect()
}

/// The node of node-share `index` of `spec` can take it: it is in the fleet and up, and no
/// earlier node-share of the gang is on it (a gang's node-shares are on distinct nodes).
pub(crate) fn check_node(state: &State, spec: &RunSpec, index: usize) -> Result<(), BackendError> {
    let (node, _) = spec.share(index).expect("an index below the gang size");
    if let Some(j) = (0..index).find(|&j| spec.share(j).is_some_and(|(n, _)| n == node)) {
        return Err(rejected(format!(
            "node-share {j} of the gang is on {node} already: a gang's node-shares are on distinct nodes"
        )));
    }
    state.node_gpus(node)?;
    if state.node_down(node) {
        return Err(rejected(format!("node `{node}` is down (removed or rebooting)")));
    }
    Ok(())
}

/// A refusal of node-share `index` of a multi-node gang, naming the share and its node; a
/// workload on one node keeps its refusal as it is.
pub(crate) fn in_share(spec: &RunSpec, index: usize, e: BackendError) -> BackendError {
    let (Some((node, _)), BackendError::Rejected(why)) = (spec.share(index).filter(|_| !spec.gang.is_empty()), &e)
    else {
        return e;
    };
    rejected(format!(
        "node-share {index} of gang workload {} on {node}: {why}",
        spec.id
    ))
}

/// Exact mode: the named devices are not held by another workload in a way they cannot be
/// shared (a whole GPU with anything; a MIG instance with its holder or a whole-GPU one; a
/// time-slice share with whole-GPU or MIG holders, or past 1000 milli-GPU of shares).
fn check_free(state: &State, b: &Binding) -> Result<(), BackendError> {
    for &g in &b.gpus {
        for &h in &state.gpus[g].holders {
            let theirs = state.runs.get(&h).and_then(|r| r.slice_on(g));
            let clash = match (&b.slice, theirs) {
                (_, None | Some(SliceSpec::HostOnly)) | (SliceSpec::HostOnly, _) => false,
                (SliceSpec::Fraction { .. }, Some(SliceSpec::Fraction { .. })) => false,
                (SliceSpec::Mig(mine), Some(SliceSpec::Mig(other))) => mine.overlaps(other),
                _ => true,
            };
            if clash {
                return Err(rejected(format!("{} is in use by workload {h}", state.gpu_name(g))));
            }
        }
        if let SliceSpec::Fraction { milli, .. } = b.slice {
            let used = state.shared_milli(g);
            if used + milli as u32 > 1000 {
                return Err(rejected(format!(
                    "{} has {} milli-GPU of time-slice shares left, {milli} asked",
                    state.gpu_name(g),
                    1000u32.saturating_sub(used)
                )));
            }
        }
    }
    Ok(())
}

fn exact(state: &State, node: &str, gpus: &[u8], slice: &SliceSpec) -> Result<Binding, BackendError> {
    state.node_gpus(node)?;
    let mut idx = Vec::with_capacity(gpus.len());
    for &g in gpus {
        let i = state.gpu(node, g)?;
        if idx.contains(&i) {
            return Err(rejected(format!("GPU {g} on {node} is listed twice")));
        }
        idx.push(i);
    }
    match slice {
        SliceSpec::HostOnly if !idx.is_empty() => {
            return Err(rejected(format!("a host-only workload names no GPUs, not {gpus:?}")));
        }
        SliceSpec::Whole | SliceSpec::Fraction { .. } if idx.is_empty() => {
            return Err(rejected(format!("no GPU named on {node}")));
        }
        SliceSpec::Mig(instance) => {
            let [g] = idx[..] else {
                return Err(rejected(format!(
                    "a MIG instance lives on one GPU; {} named on {node}",
                    gpus.len()
                )));
            };
            // Starting on an instance nobody created is what a crash between partition and
            // start would look like if recovery skipped the partition: refuse it loudly.
            if !state.gpus[g].instances.iter().any(|i| i.same_placement(instance)) {
                return Err(rejected(format!(
                    "no MIG instance {instance} on {}: partition it first",
                    state.gpu_name(g)
                )));
            }
        }
        _ => {}
    }
    Ok(Binding {
        gpus: idx,
        slice: slice.clone(),
        bound: None,
    })
}

fn by_count(state: &State, node: &str, resource: &Resource, count: u8) -> Result<Binding, BackendError> {
    let on_node = state.node_gpus(node)?;
    if count == 0 {
        return Err(rejected(format!("a request for 0 {resource} asks for nothing")));
    }
    let number = |g: usize| state.gpus[g].gpu.index;
    match resource {
        Resource::Gpu => {
            // A GPU in MIG mode is not offered as `nvidia.com/gpu` (mixed strategy).
            let free: Vec<usize> = on_node
                .iter()
                .copied()
                .filter(|&g| state.gpus[g].instances.is_empty() && state.gpus[g].holders.is_empty())
                .take(count as usize)
                .collect();
            if free.len() < count as usize {
                return Err(rejected(format!(
                    "only {} free {resource} on {node}, {count} asked",
                    free.len()
                )));
            }
            Ok(Binding {
                bound: Some(Bound {
                    gpus: free.iter().map(|&g| number(g)).collect(),
                    mig: None,
                }),
                gpus: free,
                slice: SliceSpec::Whole,
            })
        }
        Resource::Mig { profile } => {
            if count != 1 {
                return Err(rejected(format!(
                    "the sim binds one MIG device per workload; {count} {resource} asked"
                )));
            }
            let free: Option<(usize, &MigInstance)> = on_node.iter().find_map(|&g| {
                state.gpus[g]
                    .instances
                    .iter()
                    .find(|i| &i.profile == profile && state.instance_holder(g, i).is_none())
                    .map(|i| (g, i))
            });
            let Some((g, instance)) = free else {
                return Err(rejected(format!("no free {profile} on {node}")));
            };
            Ok(Binding {
                gpus: vec![g],
                slice: SliceSpec::Mig(instance.clone()),
                bound: Some(Bound {
                    gpus: vec![number(g)],
                    mig: Some(instance.clone()),
                }),
            })
        }
        Resource::SharedGpu { milli } => {
            if count != 1 {
                return Err(rejected(format!(
                    "a time-sliced replica is requested one at a time; {count} {resource} asked"
                )));
            }
            if *milli == 0 || *milli > 1000 {
                return Err(rejected(format!(
                    "a time-sliced replica is 1..=1000 milli-GPU, not {milli}"
                )));
            }
            // The device plugin spreads replicas: the GPU with the fewest, then the lowest index.
            let pick = on_node
                .iter()
                .copied()
                .filter(|&g| {
                    let gpu = &state.gpus[g];
                    let whole = gpu.holders.iter().any(|h| {
                        state
                            .runs
                            .get(h)
                            .is_some_and(|r| !matches!(r.slice_on(g), Some(SliceSpec::Fraction { .. })))
                    });
                    gpu.instances.is_empty() && !whole && state.shared_milli(g) + *milli as u32 <= 1000
                })
                .min_by_key(|&g| (state.gpus[g].holders.len(), number(g)));
            let Some(g) = pick else {
                return Err(rejected(format!("no {resource} on {node} has {milli} milli-GPU left")));
            };
            Ok(Binding {
                gpus: vec![g],
                slice: SliceSpec::Fraction {
                    milli: *milli,
                    memory_mib: None,
                },
                bound: Some(Bound {
                    gpus: vec![number(g)],
                    mig: None,
                }),
            })
        }
    }
}
