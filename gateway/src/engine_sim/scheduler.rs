//! Admission of generation requests: the `max_num_seqs` slots, the waiting and running counts,
//! the prefix-cache lookup, and the time to first token that lookup implies.
//!
//! A request waits (`vllm:num_requests_waiting`) until a slot is free, then runs
//! (`vllm:num_requests_running`) until its answer has been handed over or its client left. When
//! it starts, its prompt is looked up in the [`PrefixCache`] and the whole sequence — prompt and
//! answer, as if generated in full — is marked as cached, as an engine keeps the KV blocks of
//! what it computed. Its time to first token is then
//! [`time_to_first_token`]`(base, prefill cost per token, uncached prompt tokens)` from that
//! moment; tokens follow at the decode rate. Each request's prefill is costed on its own:
//! concurrent prefills do not slow each other down.
//!
//! The cache sits behind a mutex held for one lookup and one insert per request, O(blocks of
//! the request); the counts are atomics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::generate::count_tokens;
use super::kv_cache::{block_hashes, lookup_blocks, PrefixCache, BLOCK_TOKENS};

/// Upper bounds, in seconds, of the time-to-first-token histogram's buckets (vLLM's).
pub(crate) const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];

/// Time to first token once a request runs: `base + uncached_tokens × prefill_per_token`.
pub(crate) fn time_to_first_token(base: Duration, prefill_per_token: Duration, uncached_tokens: u32) -> Duration {
    base.saturating_add(prefill_per_token.saturating_mul(uncached_tokens))
}

/// What shapes admission; taken from the engine's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SchedulerSettings {
    /// Time to first token of a prompt that is entirely cached (and the fixed part of any).
    pub(crate) ttft_base: Duration,
    /// Prefill time per prompt token not found in the cache.
    pub(crate) prefill_per_token: Duration,
    /// Prefix-cache capacity in tokens; 0 disables prefix caching.
    pub(crate) kv_cache_tokens: u64,
    /// Requests running at once; 0 means no limit.
    pub(crate) max_num_seqs: u32,
}

/// The counters of one served model.
#[derive(Debug, Default)]
struct ModelCounters {
    running: AtomicU64,
    waiting: AtomicU64,
    /// Prompt tokens of every request that ran, cached or not.
    prompt_tokens: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    queried_tokens: AtomicU64,
    /// Prompt tokens found there.
    hit_tokens: AtomicU64,
    /// Tokens sent.
    generation_tokens: AtomicU64,
    /// Per bucket of [`TTFT_BUCKETS`] (not cumulative), then one for anything above the last.
    ttft_buckets: [AtomicU64; TTFT_BUCKETS.len() + 1],
    ttft_sum_ns: AtomicU64,
}

impl ModelCounters {
    fn observe_ttft(&self, ttft: Duration) {
        let seconds = ttft.as_secs_f64();
        let bucket = TTFT_BUCKETS.iter().position(|&bound| seconds <= bound).unwrap_or(TTFT_BUCKETS.len());
        self.ttft_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(ttft.as_nanos()).unwrap_or(u64::MAX);
        self.ttft_sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ModelSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut cumulative = 0;
        let ttft_cumulative = self
            .ttft_buckets
            .iter()
            .map(|bucket| {
                cumulative += get(bucket);
                cumulative
            })
            .collect();
        ModelSnapshot {
            running: get(&self.running),
            waiting: get(&self.waiting),
            prompt_tokens: get(&self.prompt_tokens),
            queried_tokens: get(&self.queried_tokens),
            hit_tokens: get(&self.hit_tokens),
            generation_tokens: get(&self.generation_tokens),
            ttft_cumulative,
            ttft_sum: Duration::from_nanos(get(&self.ttft_sum_ns)),
        }
    }
}

/// One model's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelSnapshot {
    pub(crate) running: u64,
    pub(crate) waiting: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) queried_tokens: u64,
    pub(crate) hit_tokens: u64,
    pub(crate) generation_tokens: u64,
    /// Cumulative counts for each bound of [`TTFT_BUCKETS`], then the total count (`+Inf`).
    pub(crate) ttft_cumulative: Vec<u64>,
    pub(crate) ttft_sum: Duration,
}

/// The whole engine at one moment: what `/metrics` shows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EngineSnapshot {
    /// Each served model's name and counters, in configuration order.
    pub(crate) models: Vec<(String, ModelSnapshot)>,
    /// Share of the KV blocks held by running requests, in `[0, 1]`.
    pub(crate) kv_cache_usage: f64,
    /// Blocks the cache holds at most.
    pub(crate) num_blocks: u64,
    /// Whether prefix caching is on.
    pub(crate) prefix_caching: bool,
}

/// The prefill of one request, decided when it starts running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefill {
    /// The prompt's tokens (what usage reports).
    pub(crate) prompt_tokens: u32,
    /// How many of them were found in the prefix cache.
    pub(crate) cached_tokens: u32,
    /// From the start of running to the first token.
    pub(crate) ttft: Duration,
}

/// A request that started running.
pub(crate) struct Admitted {
    /// When its first token is due.
    pub(crate) first_token_at: Instant,
    pub(crate) prefill: Prefill,
    /// Counts it as running until dropped.
    pub(crate) running: Running,
}

/// Shared by every request of one engine.
#[derive(Debug)]
pub(crate) struct Scheduler {
    settings: SchedulerSettings,
    models: Vec<String>,
    counters: Vec<ModelCounters>,
    /// `None` without a limit.
    slots: Option<Arc<Semaphore>>,
    cache: Mutex<PrefixCache>,
    capacity_blocks: u64,
    /// KV blocks held by running requests: their prompt and answer, rounded up to whole blocks.
    running_blocks: AtomicU64,
}

impl Scheduler {
    /// A scheduler for `models` (requests name them by index).
    pub(crate) fn new(models: &[String], settings: SchedulerSettings) -> Self {
        let cache = PrefixCache::new(settings.kv_cache_tokens);
        let max = usize::try_from(settings.max_num_seqs).unwrap_or(Semaphore::MAX_PERMITS);
        Self {
            settings,
            models: models.to_vec(),
            counters: models.iter().map(|_| ModelCounters::default()).collect(),
            slots: (settings.max_num_seqs > 0).then(|| Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS)))),
            capacity_blocks: cache.capacity_blocks() as u64,
            cache: Mutex::new(cache),
            running_blocks: AtomicU64::new(0),
        }
    }

    /// Waits for a slot, then starts the request: looks its prompt up, caches the sequence
    /// `prompt + answer`, counts it as running. `answer` is the text that follows the prompt in
    /// the sequence a next turn would resend; `completion_tokens` its length in tokens.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        model: usize,
        prompt: &str,
        answer: &str,
        completion_tokens: u32,
    ) -> Admitted {
        let arrived = Instant::now();
        let waiting = Waiting::enter(self, model);
        // The semaphore is never closed; were it, the request would run without a slot.
        let permit = match &self.slots {
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        drop(waiting);
        let prefill = self.prefill(model, prompt, answer);
        let first_token_at = Instant::now() + prefill.ttft;
        let counters = &self.counters[model];
        counters.observe_ttft(first_token_at.saturating_duration_since(arrived));
        counters.running.fetch_add(1, Ordering::Relaxed);
        let blocks = u64::from(prefill.prompt_tokens.saturating_add(completion_tokens).div_ceil(BLOCK_TOKENS));
        self.running_blocks.fetch_add(blocks, Ordering::Relaxed);
        let running = Running { scheduler: Arc::clone(self), model, blocks, _slot: permit };
        Admitted { first_token_at, prefill, running }
    }

    /// Looks `prompt` up in the prefix cache, caches `prompt + answer`, counts the tokens, and
    /// says how long the prefill takes.
    pub(crate) fn prefill(&self, model: usize, prompt: &str, answer: &str) -> Prefill {
        let prompt_tokens = count_tokens(prompt);
        let counters = &self.counters[model];
        counters.prompt_tokens.fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
        let mut cached_tokens = 0;
        if self.capacity_blocks > 0 {
            let mut sequence = String::with_capacity(prompt.len() + answer.len());
            sequence.push_str(prompt);
            sequence.push_str(answer);
            let hashes = block_hashes(&self.models[model], &sequence);
            let lookable = lookup_blocks(prompt.chars().count()).min(hashes.len());
            let hit_blocks = {
                // A poisoned lock only means another request panicked; the cache is still valid.
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                let hit = cache.cached_prefix(&hashes[..lookable]);
                cache.insert(&hashes);
                hit
            };
            // lookup_blocks keeps this below prompt_tokens.
            cached_tokens = u32::try_from(hit_blocks).unwrap_or(u32::MAX).saturating_mul(BLOCK_TOKENS);
            counters.queried_tokens.fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
            counters.hit_tokens.fetch_add(u64::from(cached_tokens), Ordering::Relaxed);
        }
        let uncached = prompt_tokens.saturating_sub(cached_tokens);
        let ttft = time_to_first_token(self.settings.ttft_base, self.settings.prefill_per_token, uncached);
        Prefill { prompt_tokens, cached_tokens, ttft }
    }

    /// Everything `/metrics` shows.
    pub(crate) fn snapshot(&self) -> EngineSnapshot {
        let kv_cache_usage = if self.capacity_blocks == 0 {
            0.0
        } else {
            (self.running_blocks.load(Ordering::Relaxed) as f64 / self.capacity_blocks as f64).min(1.0)
        };
        EngineSnapshot {
            models: self.models.iter().cloned().zip(self.counters.iter().map(ModelCounters::snapshot)).collect(),
            kv_cache_usage,
            num_blocks: self.capacity_blocks,
            prefix_caching: self.capacity_blocks > 0,
        }
    }
}

/// Counts a request as waiting for a slot until dropped (it got one, or its client left).
struct Waiting<'a>(&'a ModelCounters);

impl<'a> Waiting<'a> {
    fn enter(scheduler: &'a Scheduler, model: usize) -> Self {
        let counters = &scheduler.counters[model];
        counters.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(counters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request as running, holds its slot and its KV blocks, until dropped.
pub(crate) struct Running {
    scheduler: Arc<Scheduler>,
    model: usize,
    blocks: u64,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Running {
    /// Records `tokens` more tokens sent.
    pub(crate) fn generated(&self, tokens: u64) {
        self.scheduler.counters[self.model].generation_tokens.fetch_add(tokens, Ordering::Relaxed);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let scheduler = &self.scheduler;
        scheduler.counters[self.model].running.fetch_sub(1, Ordering::Relaxed);
        scheduler.running_blocks.fetch_sub(self.blocks, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn scheduler(kv_cache_tokens: u64, max_num_seqs: u32) -> Arc<Scheduler> {
        Arc::new(Scheduler::new(
            &["m".to_owned(), "other".to_owned()],
            SchedulerSettings {
                ttft_base: 10 * MS,
                prefill_per_token: Duration::from_micros(200),
                kv_cache_tokens,
                max_num_seqs,
            },
        ))
    }

    /// A chat prompt as the simulator flattens one: a system message, then a user message.
    fn prompt(system: &str, user: &str) -> String {
        format!("system: {system}\nuser: {user}\n")
    }

    #[test]
    fn ttft_is_the_base_plus_the_prefill_of_uncached_tokens() {
        let base = Duration::from_millis(50);
        let per = Duration::from_micros(200);
        assert_eq!(time_to_first_token(base, per, 0), base);
        assert_eq!(time_to_first_token(base, per, 2_000), base + Duration::from_millis(400));
        assert_eq!(time_to_first_token(Duration::ZERO, Duration::ZERO, u32::MAX), Duration::ZERO);
        // Saturates instead of overflowing.
        assert_eq!(time_to_first_token(Duration::MAX, per, 1), Duration::MAX);
    }

    #[test]
    fn a_second_turn_prefills_only_what_is_new() {
        let s = scheduler(65_536, 0);
        let system = "You are a careful assistant. ".repeat(300); // ~2,200 tokens
        let first = prompt(&system, "What is a lattice?");
        let cold = s.prefill(0, &first, "assistant: A partial order with joins.");
        assert_eq!(cold.cached_tokens, 0);
        assert_eq!(cold.prompt_tokens, count_tokens(&first));
        assert_eq!(cold.ttft, time_to_first_token(10 * MS, Duration::from_micros(200), cold.prompt_tokens));
        assert!(cold.ttft > Duration::from_millis(400), "{cold:?}");

        // The next turn resends the first one, the answer and a new question.
        let second = format!("{first}assistant: A partial order with joins.\nuser: And a join?\n");
        let warm = s.prefill(0, &second, "assistant: The least upper bound.");
        assert!(warm.cached_tokens >= cold.prompt_tokens - BLOCK_TOKENS, "{warm:?} after {cold:?}");
        assert!(warm.prompt_tokens - warm.cached_tokens <= 2 * BLOCK_TOKENS, "{warm:?}");
        assert!(warm.ttft < 20 * MS, "{warm:?}");

        // Another model does not share the first model's blocks.
        assert_eq!(s.prefill(1, &second, "").cached_tokens, 0);
        let snapshot = s.snapshot();
        let m = &snapshot.models[0].1;
        assert_eq!(m.queried_tokens, u64::from(cold.prompt_tokens + warm.prompt_tokens));
        assert_eq!(m.hit_tokens, u64::from(warm.cached_tokens));
    }

    #[test]
    fn an_identical_prompt_still_computes_its_last_token() {
        let s = scheduler(65_536, 0);
        let text = "x".repeat(64 * 4); // exactly four blocks
        s.prefill(0, &text, "");
        let again = s.prefill(0, &text, "");
        assert_eq!(again.prompt_tokens, 64);
        assert_eq!(again.cached_tokens, 48, "the last block holds the last token and is recomputed");
    }

    #[test]
    fn prefix_caching_off_counts_no_queries() {
        let s = scheduler(0, 0);
        let text = prompt(&"shared ".repeat(100), "q");
        s.prefill(0, &text, "");
        let again = s.prefill(0, &text, "");
        assert_eq!(again.cached_tokens, 0);
        assert_eq!(again.ttft, time_to_first_token(10 * MS, Duration::from_micros(200), again.prompt_tokens));
        let snapshot = s.snapshot();
        assert!(!snapshot.prefix_caching);
        assert_eq!(snapshot.models[0].1.queried_tokens, 0);
        assert_eq!(snapshot.models[0].1.prompt_tokens, 2 * u64::from(again.prompt_tokens));
        assert_eq!(snapshot.kv_cache_usage, 0.0);
    }

    #[tokio::test]
    async fn requests_beyond_max_num_seqs_wait_for_a_slot() {
        let s = scheduler(16 * 100, 1);
        let first = s.admit(0, "a prompt", "", 10).await;
        let snapshot = s.snapshot();
        assert_eq!((snapshot.models[0].1.running, snapshot.models[0].1.waiting), (1, 0));
        // One block of 100 is held: prompt and answer fit in one.
        assert!((snapshot.kv_cache_usage - 0.01).abs() < 1e-9, "{}", snapshot.kv_cache_usage);

        let second = tokio::spawn({
            let s = Arc::clone(&s);
            async move { s.admit(0, "another prompt", "", 10).await.prefill }
        });
        for _ in 0..100 {
            if s.snapshot().models[0].1.waiting == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let snapshot = s.snapshot();
        assert_eq!((snapshot.models[0].1.running, snapshot.models[0].1.waiting), (1, 1));

        first.running.generated(10);
        drop(first);
        let prefill = second.await.expect("second request runs");
        assert_eq!(prefill.cached_tokens, 0);
        let snapshot = s.snapshot();
        let m = &snapshot.models[0].1;
        // The second request's guard was dropped with its task.
        assert_eq!((m.running, m.waiting), (0, 0));
        assert_eq!(m.generation_tokens, 10);
        assert_eq!(m.ttft_cumulative.last().copied(), Some(2));
        assert_eq!(snapshot.kv_cache_usage, 0.0);
    }

    #[test]
    fn ttft_observations_land_in_cumulative_buckets() {
        let counters = ModelCounters::default();
        counters.observe_ttft(Duration::from_micros(500));
        counters.observe_ttft(Duration::from_millis(300));
        counters.observe_ttft(Duration::from_secs(10_000));
        let snapshot = counters.snapshot();
        assert_eq!(snapshot.ttft_cumulative.len(), TTFT_BUCKETS.len() + 1);
        assert_eq!(snapshot.ttft_cumulative[0], 1); // <= 0.001
        assert_eq!(snapshot.ttft_cumulative[8], 1); // <= 0.25
        assert_eq!(snapshot.ttft_cumulative[9], 2); // <= 0.5
        assert_eq!(snapshot.ttft_cumulative[TTFT_BUCKETS.len() - 1], 2);
        assert_eq!(snapshot.ttft_cumulative[TTFT_BUCKETS.len()], 3);
        assert_eq!(
            snapshot.ttft_sum,
            Duration::from_micros(500) + Duration::from_millis(300) + Duration::from_secs(10_000)
        );
    }
}
