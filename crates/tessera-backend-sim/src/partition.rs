//! The rules of MIG partitioning in both modes: single instances that must not overlap (exact
//! mode, as NVML's create-with-placement), whole-GPU layouts that change only while the GPU is
//! idle (operator mode, as the MIG manager), and time-slice shares of non-MIG GPUs.

use tessera_backend::{BackendError, MigInstance};

use crate::state::State;

fn rejected(msg: String) -> BackendError {
    BackendError::Rejected(msg)
}

/// Refuses an instance that does not fit the GPU's memory slices.
fn check_fits(state: &State, g: usize, instance: &MigInstance) -> Result<(), BackendError> {
    let slices = state.gpus[g].gpu.mig_slices;
    if slices == 0 {
        return Err(rejected(format!(
            "{} ({}) is not MIG-capable",
            state.gpu_name(g),
            state.gpus[g].gpu.model
        )));
    }
    if state.gpus[g].mig_off {
        return Err(rejected(format!(
            "{} is not in MIG mode (an admin disabled it)",
            state.gpu_name(g)
        )));
    }
    if instance.size == 0 || instance.end() > slices {
        return Err(rejected(format!(
            "{instance} does not fit the {slices} memory slices of {}",
            state.gpu_name(g)
        )));
    }
    Ok(())
}

/// Exact mode: `Ok(true)` when the instance must be created, `Ok(false)` when it exists already.
pub(crate) fn check_instance(state: &State, g: usize, instance: &MigInstance) -> Result<bool, BackendError> {
    check_fits(state, g, instance)?;
    let existing = &state.gpus[g].instances;
    if existing.iter().any(|i| i.same_placement(instance)) {
        return Ok(false);
    }
    if let Some(taken) = existing.iter().find(|i| i.overlaps(instance)) {
        let (from, to) = (taken.start.max(instance.start), taken.end().min(instance.end()) - 1);
        return Err(rejected(format!(
            "slices {from}..{to} of {} are taken by {}",
            state.gpu_name(g),
            taken.profile
        )));
    }
    Ok(true)
}

/// Exact mode: destroys the instance if it exists; refuses while a workload uses it, as NVML
/// answers "in use".
pub(crate) fn destroy_instance(state: &mut State, g: usize, instance: &MigInstance) -> Result<(), BackendError> {
    if let Some(holder) = state.instance_holder(g, instance) {
        return Err(rejected(format!(
            "MIG instance {instance} of {} is in use by workload {holder}",
            state.gpu_name(g)
        )));
    }
    state.gpus[g].instances.retain(|i| !i.same_placement(instance));
    Ok(())
}

/// The layout sorted by start slice, the order the state keeps.
pub(crate) fn sorted(instances: &[MigInstance]) -> Vec<MigInstance> {
    let mut v = instances.to_vec();
    v.sort_by_key(|i| (i.start, i.size, i.profile_id));
    v
}

/// Operator mode: `Ok(true)` when the layout can be applied, `Ok(false)` when it is the current
/// one. Re-laying out a GPU destroys every instance on it, so any change needs an idle GPU.
pub(crate) fn check_layout(state: &State, g: usize, instances: &[MigInstance]) -> Result<bool, BackendError> {
    let wanted = sorted(instances);
    for i in &wanted {
        check_fits(state, g, i)?;
    }
    if let Some(pair) = wanted.windows(2).find(|w| w[0].overlaps(&w[1])) {
        return Err(rejected(format!(
            "the layout for {} overlaps itself: {} and {}",
            state.gpu_name(g),
            pair[0],
            pair[1]
        )));
    }
    let current = &state.gpus[g].instances;
    if current.len() == wanted.len() && current.iter().zip(&wanted).all(|(a, b)| a.same_placement(b)) {
        return Ok(false);
    }
    let gpu = &state.gpus[g];
    if !gpu.holders.is_empty() {
        let users: Vec<String> = gpu
            .holders
            .iter()
            .map(|h| match state.runs.get(h).and_then(|r| r.slice_on(g)) {
                Some(tessera_backend::SliceSpec::Mig(i)) => format!("{i} by workload {h}"),
                Some(tessera_backend::SliceSpec::Fraction { .. }) => format!("a time-slice share by workload {h}"),
                _ => format!("the whole GPU by workload {h}"),
            })
            .collect();
        return Err(rejected(format!(
            "cannot change the MIG layout of {} while it is in use ({}): re-laying out a GPU destroys every instance on it",
            state.gpu_name(g),
            users.join(", ")
        )));
    }
    Ok(true)
}

/// A share needs a GPU out of MIG mode and a sensible fraction.
pub(crate) fn check_share(state: &State, g: usize, milli: u16) -> Result<(), BackendError> {
    if milli == 0 || milli > 1000 {
        return Err(rejected(format!(
            "a time-slice share is 1..=1000 milli-GPU, not {milli}"
        )));
    }
    if !state.gpus[g].instances.is_empty() {
        return Err(rejected(format!(
            "{} has MIG instances; it cannot be time-sliced",
            state.gpu_name(g)
        )));
    }
    Ok(())
}

/// "3g.40gb@0, 3g.40gb@4", or "no MIG instances".
pub(crate) fn layout_text(instances: &[MigInstance]) -> String {
    if instances.is_empty() {
        return "no MIG instances".into();
    }
    instances
        .iter()
        .map(|i| format!("{}@{}", i.profile, i.start))
        .collect::<Vec<_>>()
        .join(", ")
}
