//! Replicas and leadership: which replica of the control plane runs the lifecycle loop.
//!
//! Any number of `tessera serve` processes may share one PostgreSQL database. Exactly one of
//! them leads: it holds the lease row ([`tessera_store::LeaseStore`]) and alone runs the
//! lifecycle loop — the scheduler, the backend's effects, every lifecycle commit. The others
//! follow: they serve reads from the database and forward writes to the leader's advertised
//! URL ([`crate::forward`]).
//!
//! The [`Supervisor`] of each replica:
//!
//! * as a follower, tries to acquire the lease every [`HaSettings::poll_every`]; until it
//!   wins it reads who leads (for forwarding) and rebuilds what readers see from the database
//!   every [`HaSettings::view_every`];
//! * when it wins, starts a loop fenced with its epoch: the loop rebuilds its state from the
//!   store and reconciles with the backend (the start-up recovery), then runs; meanwhile and
//!   after, the supervisor renews the lease every [`HaSettings::renew_every`];
//! * steps down at once — aborting the loop and its backend operations — when a renewal says
//!   the lease is gone, when its local deadline passes without a successful renewal (the lease
//!   expires on the database's clock no sooner than `lease` after the last renewal was sent, so
//!   the deadline comes first), when the loop stops because a batch was fenced, or on Ctrl-C or SIGTERM
//!   (then it releases the lease so that a follower takes over without waiting).
//!
//! Fencing makes the database, not the supervisor's timing, the guarantee: a leader that was
//! paused past its lease and resumes may run a few more statements before it notices, but
//! every lifecycle batch carries its epoch and the store refuses it once another replica holds
//! the lease. On SQLite the server is one process: it always leads and its batches carry no
//! fence.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tessera_store::{Fence, ReplicaRecord, Store};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lifecycle::{Leading, Lifecycle, LoopConfig};
use crate::metrics::Metrics;

/// Timing of leader election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaSettings {
    /// How long a lease lasts after each renewal.
    pub lease: Duration,
    /// How often the leader renews it.
    pub renew_every: Duration,
    /// How often a follower tries to acquire it (and reads who leads).
    pub poll_every: Duration,
    /// How often a follower rebuilds its view of the fleet from the database.
    pub view_every: Duration,
    /// How often a replica records its heartbeat.
    pub heartbeat_every: Duration,
}

impl Default for HaSettings {
    fn default() -> Self {
        HaSettings {
            lease: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
            poll_every: Duration::from_millis(250),
            view_every: Duration::from_secs(1),
            heartbeat_every: Duration::from_secs(2),
        }
    }
}

/// The leader stops acting this long before its lease can have expired on the database's
/// clock, so that clocks running at slightly different rates never let two replicas act.
const SAFETY_MARGIN: Duration = Duration::from_millis(300);

/// Replicas silent for longer than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Whether a replica leads (holds the lease) or follows the one that does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    #[default]
    Follower,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a replica is now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaState {
    pub role: Role,
    /// This replica leads and its loop runs (`role` is `leader` from the lease's acquisition,
    /// while the loop still recovers).
    pub leading: bool,
    /// The epoch of the lease this replica holds, or of the leader it follows.
    pub epoch: Option<u64>,
    /// The leader's replica id and advertised URL, when one is known.
    pub leader_id: Option<String>,
    pub leader_url: Option<String>,
    /// The last database round trip of the supervisor succeeded.
    pub database: bool,
    /// Ready to serve: leading, or following a known leader with a view built.
    pub ready: bool,
    /// Why not, when not ready.
    pub reason: Option<String>,
}

/// This replica: its identity and what it is now.
pub struct Replica {
    pub id: String,
    /// The URL other replicas forward writes to.
    pub url: String,
    /// Replicas share the database and elect a leader (PostgreSQL); `false`: the only process
    /// on its store (SQLite), always the leader.
    pub shared: bool,
    pub started_at: i64,
    state: watch::Sender<ReplicaState>,
}

impl Replica {
    pub fn new(id: String, url: String, shared: bool) -> Replica {
        Replica {
            id,
            url,
            shared,
            started_at: crate::clock::now_ms(),
            state: watch::Sender::new(ReplicaState {
                role: Role::Follower,
                reason: Some("starting".into()),
                ..Default::default()
            }),
        }
    }

    /// What it is now.
    pub fn state(&self) -> ReplicaState {
        self.state.borrow().clone()
    }

    /// Whether this replica leads with a running loop.
    pub fn is_leader(&self) -> bool {
        self.state.borrow().leading
    }

    /// Where writes go when this replica does not lead: the known leader's URL.
    /// `Some(epoch)` while this replica leads and its loop runs (`Some(None)` on a store it
    /// does not share, which it always leads); `None` otherwise.
    pub fn leading_epoch(&self) -> Option<Option<u64>> {
        let s = self.state.borrow();
        s.leading.then_some(s.epoch)
    }

    pub fn leader_url(&self) -> Option<String> {
        let s = self.state.borrow();
        if s.role == Role::Leader {
            return None;
        }
        s.leader_url.clone()
    }

    fn update(&self, f: impl FnOnce(&mut ReplicaState)) {
        self.state.send_modify(|s| {
            f(s);
            s.ready = match s.role {
                Role::Leader => s.leading,
                Role::Follower => s.database && s.leader_url.is_some() && s.reason.is_none(),
            };
        });
    }

    /// Waits until the first round of the supervisor is done (leading, following, or knowing
    /// why neither), at most `limit`.
    pub async fn settled(&self, limit: Duration) {
        let mut rx = self.state.subscribe();
        let _ = tokio::time::timeout(
            limit,
            rx.wait_for(|s| s.ready || !matches!(s.reason.as_deref(), Some("starting" | "recovering"))),
        )
        .await;
    }

    fn record(&self) -> ReplicaRecord {
        ReplicaRecord {
            id: self.id.clone(),
            url: self.url.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            started_at: self.started_at,
            last_seen: 0,
            age_ms: 0,
        }
    }
}

/// A replica id: the host name and a random suffix (a restarted process is a new replica).
pub fn new_id() -> String {
    use rand::Rng;
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tessera".into());
    format!("{host}-{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
}

/// Drives one replica's leadership (see the module documentation).
pub struct Supervisor {
    pub replica: Arc<Replica>,
    pub lifecycle: Lifecycle,
    pub cfg: LoopConfig,
    pub settings: HaSettings,
    pub metrics: Arc<Metrics>,
    /// Set to `true` to step down and stop (Ctrl-C or SIGTERM).
    pub shutdown: watch::Receiver<bool>,
}

impl Supervisor {
    fn store(&self) -> &Arc<dyn Store> {
        &self.cfg.store
    }

    /// Runs a replica that shares its database: follows, leads when it wins the lease, and
    /// steps down when it must, until shutdown.
    pub async fn run(mut self) {
        let mut poll = tokio::time::interval(self.settings.poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_view: Option<Instant> = None;
        let mut last_beat: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = poll.tick() => {}
                _ = self.shutdown.changed() => return,
            }
            if *self.shutdown.borrow() {
                return;
            }
            self.heartbeat(&mut last_beat).await;
            let sent = Instant::now();
            let ttl = self.settings.lease.as_millis() as u64;
            match self
                .store()
                .acquire_lease(&self.replica.id, &self.replica.url, ttl)
                .await
            {
                Ok(Some(epoch)) => {
                    let stop = self
                        .lead(epoch, sent + self.settings.lease - SAFETY_MARGIN, &mut last_beat)
                        .await;
                    last_view = None;
                    if stop {
                        return;
                    }
                    continue;
                }
                Ok(None) => self.follow().await,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot reach the database to elect a leader");
                    self.replica.update(|s| {
                        s.role = Role::Follower;
                        s.database = false;
                        s.leader_id = None;
                        s.leader_url = None;
                        s.epoch = None;
                        s.reason = Some(format!("the database is unavailable: {e}"));
                    });
                }
            }
            if last_view.is_none_or(|t| t.elapsed() >= self.settings.view_every) && self.replica.state().database {
                match self.lifecycle.refresh_view(&self.cfg).await {
                    Ok(()) => {
                        last_view = Some(Instant::now());
                        self.replica.update(|s| {
                            if s.reason.as_deref() == Some("starting") {
                                s.reason = None;
                            }
                        });
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot rebuild the follower's view"),
                }
            }
        }
    }

    /// A follower's round: who leads now.
    async fn follow(&self) {
        match self.store().lease().await {
            Ok(lease) => {
                let leader = lease.filter(|l| l.valid() && l.holder != self.replica.id);
                self.replica.update(|s| {
                    s.role = Role::Follower;
                    s.database = true;
                    s.epoch = leader.as_ref().map(|l| l.epoch);
                    s.leader_id = leader.as_ref().map(|l| l.holder.clone());
                    s.leader_url = leader.as_ref().map(|l| l.url.clone());
                    s.reason = match (&leader, s.reason.as_deref()) {
                        (_, Some("starting")) => Some("starting".into()),
                        (None, _) => Some("no replica leads at the moment".into()),
                        (Some(_), _) => None,
                    };
                });
            }
            Err(e) => self.replica.update(|s| {
                s.database = false;
                s.reason = Some(format!("the database is unavailable: {e}"));
            }),
        }
    }

    async fn heartbeat(&self, last: &mut Option<Instant>) {
        if last.is_some_and(|t| t.elapsed() < self.settings.heartbeat_every) {
            return;
        }
        *last = Some(Instant::now());
        if let Err(e) = self.store().heartbeat(&self.replica.record()).await {
            tracing::debug!(error = %e, "cannot record this replica's heartbeat");
        } else if self.replica.is_leader() {
            let _ = self.store().prune_replicas(FORGET_AFTER.as_millis() as u64).await;
        }
    }

    /// Leads with the lease of `epoch` until it must step down; `true` when shutting down.
    async fn lead(&mut self, epoch: u64, deadline: Instant, last_beat: &mut Option<Instant>) -> bool {
        let r = &self.replica;
        tracing::info!(replica = %r.id, epoch, "acquired the leader lease; rebuilding state from the store");
        let started = Instant::now();
        r.update(|s| {
            s.role = Role::Leader;
            s.leading = false;
            s.database = true;
            s.epoch = Some(epoch);
            s.leader_id = Some(r.id.clone());
            s.leader_url = Some(r.url.clone());
            s.reason = Some("recovering".into());
        });
        self.metrics.leadership("acquired");
        let fence = Fence {
            holder: r.id.clone(),
            epoch,
        };
        let ttl = self.settings.lease.as_millis() as u64;
        let mut deadline = deadline;
        let mut renew = tokio::time::interval_at(Instant::now() + self.settings.renew_every, self.settings.renew_every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading: Option<Leading> = None;
        let (why, shutting_down) = {
            let lead = self.lifecycle.lead(&self.cfg, Some(fence));
            tokio::pin!(lead);
            loop {
                tokio::select! {
                    l = &mut lead, if leading.is_none() => match l {
                        Ok(l) => {
                            leading = Some(l);
                            tracing::info!(replica = %r.id, epoch, elapsed_ms = started.elapsed().as_millis() as u64, "leading");
                            self.metrics.set_leader(true);
                            r.update(|s| {
                                s.leading = true;
                                s.reason = None;
                            });
                        }
                        Err(e) => break (format!("recovery failed: {e}"), false),
                    },
                    _ = renew.tick() => {
                        let sent = Instant::now();
                        let renewed = tokio::time::timeout_at(deadline, self.cfg.store.renew_lease(&r.id, epoch, ttl)).await;
                        match renewed {
                            Ok(Ok(true)) => deadline = sent + self.settings.lease - SAFETY_MARGIN,
                            Ok(Ok(false)) => break ("another replica holds the lease".into(), false),
                            Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the leader lease"),
                            Err(_) => break ("the lease could not be renewed before it expired".into(), false),
                        }
                        if leading.as_ref().is_some_and(Leading::is_finished) {
                            break ("the loop stopped: a batch was fenced".into(), false);
                        }
                        self.heartbeat(last_beat).await;
                    }
                    _ = tokio::time::sleep_until(deadline) => {
                        break ("the lease could not be renewed before it expired".into(), false);
                    }
                    _ = self.shutdown.changed() => break ("shutting down".into(), true),
                }
            }
        };
        // Stop acting at once: the loop and its backend operations end here.
        drop(leading);
        self.metrics.set_leader(false);
        self.metrics.leadership("lost");
        tracing::warn!(replica = %r.id, epoch, reason = %why, "stepped down");
        r.update(|s| {
            s.role = Role::Follower;
            s.leading = false;
            s.leader_id = None;
            s.leader_url = None;
            s.epoch = None;
            s.reason = Some(format!("stepped down: {why}"));
        });
        // Let a follower take over without waiting for the lease to expire (if the database
        // can be reached; otherwise the lease expires by itself).
        let _ = tokio::time::timeout(self.settings.renew_every, self.cfg.store.release_lease(&r.id, epoch)).await;
        shutting_down
    }

    /// The only replica of an unshared store leads for good from now on ([`Self::run_alone`]
    /// then runs it).
    pub fn lead_alone(&self) {
        self.metrics.leadership("acquired");
        self.metrics.set_leader(true);
        self.replica.update(|s| {
            s.role = Role::Leader;
            s.leading = true;
            s.database = true;
            s.leader_id = Some(self.replica.id.clone());
            s.leader_url = Some(self.replica.url.clone());
            s.reason = None;
        });
    }

    /// Runs the only replica of an unshared store, which leads ([`Self::lead_alone`]; `leading`
    /// is its loop), and records heartbeats.
    pub async fn run_alone(mut self, leading: Leading) {
        let mut last_beat = None;
        let mut tick = tokio::time::interval(self.settings.heartbeat_every);
        loop {
            tokio::select! {
                _ = tick.tick() => self.heartbeat(&mut last_beat).await,
                _ = self.shutdown.changed() => break,
            }
        }
        drop(leading);
    }
}
