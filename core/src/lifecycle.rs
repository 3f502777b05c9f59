//! The local node's lifecycle: JOIN → SERVE → DOWN → LEFT, and new generations.
//!
//! - JOIN when the daemon starts;
//! - SERVE once the engine is healthy and its models are known ([`Input::EngineReady`]);
//! - DOWN when draining — requested, or the walltime minus the drain window reached — or when
//!   the engine fails;
//! - LEFT when a drain has no request in flight any more or its deadline passes; the node then
//!   asks the runtime to stop the engine, spreads LEFT for `leave_linger`, and asks to exit.
//!
//! The local state only moves forward within a generation. A node starts a new generation when
//! the engine comes back after a failure, when its model set shrinks, and when it hears a version
//! of its own record that it does not hold (a false DOWN, or a record from before a restart): it
//! refutes by moving to a generation above the one it heard.
//!
//! [`Input::EngineReady`]: crate::Input::EngineReady

use crate::node::{Command, Node, Output};
use crate::record::{Lifecycle, Load, Model, ModelSet, Record, MAX_MODEL_NAME};
use crate::replica::Merged;
use crate::time::Time;
use crate::timer::Timer;

/// Lifecycle facts the record does not carry.
#[derive(Clone, Debug, Default)]
pub(crate) struct Local {
    /// A drain is under way: LEFT follows once nothing is in flight.
    pub draining: bool,
    /// The allocation's end, if known.
    pub walltime: Option<Time>,
    /// The latest load report.
    pub load: Load,
}

impl Node {
    pub(crate) fn engine_ready(&mut self, models: Vec<Model>) {
        if self.local.draining {
            return;
        }
        // Names the wire cannot carry are dropped here rather than poisoning every datagram
        // that would carry our record; the runtime validates and logs them first.
        let valid = |m: &Model| !m.name.is_empty() && m.name.len() <= MAX_MODEL_NAME;
        self.stats.models_rejected += models.iter().filter(|m| !valid(m)).count() as u64;
        let models = ModelSet::from_models(models.into_iter().filter(valid).collect());
        let current = self.replica.local().clone();
        match current.state {
            Lifecycle::Join => self.update_local(|r| {
                r.models = models;
                r.state = Lifecycle::Serve;
            }),
            Lifecycle::Serve if current.models == models => {}
            Lifecycle::Serve if models.absorbs(&current.models) => self.update_local(|r| r.models = models),
            // A shrunken model set, or an engine back after a failure: only a new generation can
            // withdraw models or leave DOWN.
            Lifecycle::Serve | Lifecycle::Down => self.new_generation(current.generation, Lifecycle::Serve, models),
            Lifecycle::Left => {}
        }
    }

    pub(crate) fn engine_failed(&mut self) {
        if self.replica.local().state < Lifecycle::Down {
            self.update_local(|r| r.state = Lifecycle::Down);
        }
    }

    pub(crate) fn start_drain(&mut self) {
        self.timers.stop(Timer::DrainStart);
        let state = self.replica.local().state;
        if self.local.draining || state == Lifecycle::Left {
            return;
        }
        self.local.draining = true;
        let deadline = (self.now + self.config.drain_window).min(self.local.walltime.unwrap_or(Time::NEVER));
        self.timers.set(Timer::DrainDeadline, deadline);
        if state < Lifecycle::Down {
            self.update_local(|r| r.state = Lifecycle::Down);
        }
        self.leave_if_drained();
    }

    pub(crate) fn set_walltime(&mut self, at: Time) {
        self.local.walltime = Some(at);
        if self.local.draining {
            // Already draining: the walltime can only bring the deadline forward.
            let deadline = self.timers.get(Timer::DrainDeadline).unwrap_or(Time::NEVER).min(at);
            self.timers.set(Timer::DrainDeadline, deadline);
            return;
        }
        let start = at.saturating_sub(self.config.drain_window);
        if start <= self.now {
            self.start_drain();
        } else {
            self.timers.set(Timer::DrainStart, start);
        }
    }

    pub(crate) fn set_load(&mut self, load: Load) {
        self.local.load = load;
        self.leave_if_drained();
    }

    fn leave_if_drained(&mut self) {
        if self.local.draining && self.local.load.in_flight == 0 {
            self.leave();
        }
    }

    /// Moves to LEFT, stops the engine and schedules the exit.
    pub(crate) fn leave(&mut self) {
        self.timers.stop(Timer::DrainDeadline);
        if self.replica.local().state == Lifecycle::Left {
            return;
        }
        self.update_local(|r| r.state = Lifecycle::Left);
        self.timers.stop(Timer::DrainStart);
        self.outputs.push_back(Output::Command(Command::StopEngine));
        self.timers.set(Timer::Exit, self.now + self.config.leave_linger);
    }

    /// Someone holds a version of our record that we do not (a DOWN we never declared, or a
    /// record from before a restart): move to a generation above it, keeping our own state.
    pub(crate) fn refute(&mut self, heard_generation: u64) {
        self.stats.refutations += 1;
        let current = self.replica.local().clone();
        let at_least = current.generation.max(heard_generation);
        self.new_generation(at_least, current.state, current.models.clone());
    }

    /// Starts generation `above + 1` in `state` with `models`.
    fn new_generation(&mut self, above: u64, state: Lifecycle, models: ModelSet) {
        let current = self.replica.local().clone();
        let mut next = Record::new(
            current.id,
            above.saturating_add(1),
            current.role,
            current.hardware.clone(),
            current.reach.clone(),
        );
        next.state = state;
        next.models = models;
        next.load = self.local.load;
        self.stats.new_generations += 1;
        self.seal(&mut next);
        let merged = self.replica.set_local(self.now, next);
        self.after_local_change(&current, merged);
    }

    /// Applies an owner change to the local record; every change bumps the heartbeat (the SWIM
    /// incarnation within the generation), so that the new version covers the old.
    pub(crate) fn update_local(&mut self, change: impl FnOnce(&mut Record)) {
        let current = self.replica.local().clone();
        let mut next = (*current).clone();
        change(&mut next);
        next.heartbeat = next.heartbeat.saturating_add(1);
        debug_assert!(next.state >= current.state, "lifecycle moved backwards within a generation");
        self.seal(&mut next);
        let merged = self.replica.set_local(self.now, next);
        self.after_local_change(&current, merged);
    }

    fn after_local_change(&mut self, before: &Record, merged: Merged) {
        let after = self.replica.local().clone();
        if let Some(routable) = merged.routable {
            self.emit_routable(after.id, routable);
        }
        self.spread_local_change();
        if after.state != before.state || after.generation != before.generation {
            self.emit_local_state();
            // Lifecycle news is urgent: gateways must stop routing to a draining node at once.
            self.announce();
        }
    }
}
