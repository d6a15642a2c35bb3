//! Background sampling while kubelet data is asked for: a CPU rate is only as current as the
//! two samples it comes from, and a rate over an idle hour is no usage of now. [`Demand`]
//! records when each node's data was last asked for; while a node was asked for within
//! `--idle-after`, [`run`] samples it every [`Sampling::interval`] (only when its cached sample
//! is at least half an interval old; a missing one is fetched through the cache's single
//! flight, so a node a request is fetching is not fetched twice), which keeps a pair of samples
//! at most about one interval plus a kubelet housekeeping period apart. Once no node was asked for within `--idle-after`, the loop parks on a [`Notify`]
//! until the next request: an idle percolator makes no kubelet requests and wakes no timer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::lock;

/// How often nodes are sampled in the background and for how long after the last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampling {
    /// The widest window a CPU rate may span (`--max-rate-window`).
    pub max_window: Duration,
    /// Time between two background samples of a node.
    pub interval: Duration,
    /// How long a node is sampled after its data was last asked for (`--idle-after`, at least
    /// the cache TTL plus an interval: answers served from the caches do not ask); zero turns
    /// background sampling off (nodes are then fetched only on demand).
    pub idle_after: Duration,
    /// When an answer whose CPU was withheld can be asked again with a fresh pair: the answer
    /// is cached for the TTL, and a new sample comes within an interval after that.
    pub retry_after: Duration,
}

impl Sampling {
    /// The default `--idle-after`: longer than any sensible HPA sync period or dashboard
    /// refresh, short enough that a forgotten `watch kubectl top` stops costing soon after it
    /// ends.
    pub(crate) const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(300);

    /// The settings for a cache TTL (`--cache-ttl`), a largest rate window and an idle
    /// period: one sample per TTL, and at least three per window so that a pair of distinct
    /// samples stays within it whatever the TTL. A node's sample is served for about one
    /// interval ([`sample_ttl`](Self::sample_ttl)).
    pub(crate) fn new(cache_ttl: Duration, max_window: Duration, idle_after: Duration) -> Self {
        let third = max_window / 3;
        let interval = if cache_ttl.is_zero() { third } else { cache_ttl.min(third) };
        let interval = interval.max(Duration::from_millis(100));
        // Requests answered from the caches for a whole TTL never reach the kubelet client:
        // an idle period shorter than that would stop sampling under steady requests.
        let idle_after = if idle_after.is_zero() { idle_after } else { idle_after.max(cache_ttl + interval) };
        Self { max_window, interval, idle_after, retry_after: cache_ttl + interval }
    }

    /// How long a node's fetched sample is served: `--cache-ttl`, at most one interval (a
    /// sample older than that is not current enough to pair). While sampling, half an interval
    /// more, so that the next round's sample lands before the last one expires and a request
    /// between the two never fetches on its own (the rounds replace samples at one interval of
    /// age; an idle client's samples expire after one and a half).
    pub(crate) fn sample_ttl(&self, cache_ttl: Duration) -> Duration {
        let ttl = cache_ttl.min(self.interval);
        if ttl.is_zero() || self.idle_after.is_zero() { ttl } else { ttl + self.interval / 2 }
    }
}

/// When each node's data was last asked for, and the wake-up of a parked sampler.
#[derive(Debug, Default)]
pub(super) struct Demand {
    asked: Mutex<HashMap<String, Instant>>,
    wake: Notify,
}

impl Demand {
    /// Records that `node`'s data is wanted now; wakes the sampler if nothing was wanted.
    pub(super) fn ask(&self, node: &str) {
        let now = Instant::now();
        let mut asked = lock(&self.asked);
        let was_idle = asked.is_empty();
        match asked.get_mut(node) {
            Some(at) => *at = now,
            None => {
                asked.insert(node.to_owned(), now);
            }
        }
        drop(asked);
        if was_idle {
            // A permit is stored if the sampler is not parked yet: no wake-up is lost.
            self.wake.notify_one();
        }
    }

    /// Forgets `node` (it left the inventory).
    pub(super) fn forget(&self, node: &str) {
        lock(&self.asked).remove(node);
    }

    /// The nodes asked for within `idle_after`, sorted; the others are forgotten.
    pub(super) fn recent(&self, idle_after: Duration) -> Vec<String> {
        let now = Instant::now();
        let mut asked = lock(&self.asked);
        asked.retain(|_, at| now.saturating_duration_since(*at) < idle_after);
        let mut nodes: Vec<String> = asked.keys().cloned().collect();
        nodes.sort_unstable();
        nodes
    }

    /// Resolves at the next [`ask`](Self::ask) after nothing was wanted.
    pub(super) async fn asked(&self) {
        self.wake.notified().await;
    }
}

/// What the loop samples with.
pub(super) trait Sampler: Send + Sync {
    /// Takes a new sample of `node` and caches it, unless its cached sample is younger than
    /// `age`.
    fn refresh(&self, node: &str, age: Duration) -> impl Future<Output = ()> + Send;
}

/// Samples the nodes of `demand` every `sampling.interval` while they are asked for; parks when
/// none is. Runs until dropped (the client aborts it, and with it every refresh it started).
///
/// Each refresh is a task of its own, so that reading and parsing the nodes' answers spreads
/// over the runtime's workers instead of queueing on the sampler's one. At most `limit` run at
/// once (the client's fetch slots): the nodes due beyond that wait in the sampler's queue, the
/// one sampled longest ago first, not on the slots, where a request's own fetch would queue behind
/// them.
///
/// A round's refreshes start paced over its first half interval, each node at about the same
/// place in every round, so that the nodes do not all fetch at the same instant (a burst of
/// tasks, connections and buffers every interval); a node's sample is still replaced at one
/// interval of age, half an interval before it expires.
///
/// Rounds start on the interval whatever their nodes do: a node whose refresh is still queued
/// or running (a kubelet that hangs until `--kubelet-request-timeout`) is skipped by the next
/// rounds until it ends, so one slow kubelet neither holds back the sampling of the others
/// (whose samples would expire and be fetched by requests instead) nor gets a second fetch in
/// flight. A round that starts with nodes of an earlier round still queued means the sampler
/// cannot get through its nodes in an interval at `limit` fetches: that is logged, once, with
/// its recovery.
pub(super) async fn run<S: Sampler + 'static>(
    sampler: Arc<S>,
    demand: &Demand,
    sampling: Sampling,
    limit: usize,
) {
    let limit = limit.max(1);
    let mut active = false;
    let mut behind = false;
    let mut running = JoinSet::new();
    let mut nodes_of: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    let mut busy: HashSet<String> = HashSet::new();
    // When each node's last refresh started.
    let mut started: HashMap<String, Instant> = HashMap::new();
    loop {
        let nodes = demand.recent(sampling.idle_after);
        if nodes.is_empty() && running.is_empty() && queue.is_empty() {
            if active {
                tracing::info!(idle_after = ?sampling.idle_after, "kubelet sampling paused: no request needed kubelet data");
                active = false;
            }
            demand.asked().await;
            continue;
        }
        if !active {
            tracing::info!(nodes = nodes.len(), interval = ?sampling.interval, "kubelet sampling resumed");
            active = true;
        }
        let round = Instant::now();
        let (queued, in_flight) = (queue.len(), running.len());
        if queued > 0 && !behind {
            tracing::warn!(
                nodes = nodes.len(),
                queued,
                in_flight,
                interval = ?sampling.interval,
                max_concurrency = limit,
                "kubelet sampling falls behind: nodes due in the last round were not fetched within an interval, \
                 and their samples age past it until it catches up (kubelets answering slowly, or more nodes than \
                 max_concurrency fetches get through in an interval; a longer --cache-ttl lengthens the interval)"
            );
            behind = true;
        } else if queued == 0 && behind {
            tracing::info!(nodes = nodes.len(), in_flight, "kubelet sampling caught up");
            behind = false;
        }
        tracing::debug!(nodes = nodes.len(), queued, in_flight, "kubelet sampling round");
        let half = sampling.interval / 2;
        // The nodes not queued or running, the one sampled longest ago first: when the
        // sampler falls behind, no node waits a turn more than another.
        started.retain(|node, _| nodes.binary_search(node).is_ok());
        let mut due: Vec<String> = nodes.into_iter().filter(|node| !busy.contains(node)).collect();
        due.sort_by_key(|node| started.get(node).copied());
        for node in due {
            busy.insert(node.clone());
            queue.push_back(node);
        }
        // Paced over the first half interval (see above); the order is stable across rounds.
        let pace = half / u32::try_from(queue.len().max(1)).unwrap_or(u32::MAX);
        let mut launch_at = round;
        let next = tokio::time::sleep_until(round + sampling.interval);
        tokio::pin!(next);
        loop {
            let now = Instant::now();
            while running.len() < limit
                && launch_at <= now
                && let Some(node) = queue.pop_front()
            {
                started.insert(node.clone(), now);
                let sampler = Arc::clone(&sampler);
                let task = node.clone();
                let id = running.spawn(async move { sampler.refresh(&task, half).await }).id();
                nodes_of.insert(id, node);
                launch_at += pace;
            }
            // Waiting for the next launch only makes sense while a slot is free for it.
            let paced = !queue.is_empty() && running.len() < limit;
            tokio::select! {
                Some(done) = running.join_next_with_id() => {
                    // A refresh that panicked ends as one that failed: its node is sampled again.
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(error) => error.id(),
                    };
                    if let Some(node) = nodes_of.remove(&id) {
                        busy.remove(&node);
                    }
                }
                () = tokio::time::sleep_until(launch_at), if paced => {}
                () = &mut next => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn the_interval_keeps_three_samples_in_a_window_and_follows_the_ttl() {
        let secs = Duration::from_secs;
        let s = |ttl, window| Sampling::new(secs(ttl), secs(window), secs(300));
        assert_eq!(
            (s(15, 60).interval, s(15, 60).retry_after, s(15, 60).idle_after),
            (secs(15), secs(30), secs(300))
        );
        assert_eq!(s(15, 60).sample_ttl(secs(15)), Duration::from_millis(22_500), "outlives the next round");
        let on_demand = Sampling::new(secs(15), secs(60), Duration::ZERO);
        assert_eq!(on_demand.sample_ttl(secs(15)), secs(15), "without a sampler, the TTL");
        assert_eq!(s(60, 60).interval, secs(20));
        assert_eq!(s(600, 60).sample_ttl(secs(600)), secs(30), "a sample is served about one interval");
        assert_eq!(s(600, 60).idle_after, secs(620), "idle only after the caches stop answering");
        assert_eq!(s(0, 60).interval, secs(20));
        assert_eq!(s(0, 60).sample_ttl(secs(0)), secs(0), "no caching stays no caching");
        assert_eq!(s(5, 60).interval, secs(5));
        assert_eq!(s(1, 0).interval, Duration::from_millis(100), "never a busy loop");
        assert_eq!(
            Sampling::new(secs(15), secs(60), Duration::ZERO).idle_after,
            Duration::ZERO,
            "off stays off"
        );
    }

    /// Runs the sampler over `demand` with rounds every 15 s, until the handle is aborted.
    fn start<S: Sampler + 'static>(
        sampler: &Arc<S>,
        demand: &Arc<Demand>,
        idle_after: Duration,
        limit: usize,
    ) -> tokio::task::JoinHandle<()> {
        let sampling = Sampling {
            max_window: Duration::from_secs(60),
            interval: Duration::from_secs(15),
            idle_after,
            retry_after: Duration::from_secs(30),
        };
        let (sampler, demand) = (Arc::clone(sampler), Arc::clone(demand));
        tokio::spawn(async move { run(sampler, &demand, sampling, limit).await })
    }

    #[derive(Default)]
    struct Counting {
        samples: Mutex<Vec<String>>,
        fresh: AtomicUsize,
    }

    impl Sampler for Counting {
        async fn refresh(&self, node: &str, _age: Duration) {
            if self.fresh.load(Ordering::SeqCst) == 0 {
                lock(&self.samples).push(node.to_owned());
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_are_sampled_while_asked_for_and_not_after() {
        let sampler = Arc::new(Counting::default());
        let demand = Arc::new(Demand::default());
        let task = start(&sampler, &demand, Duration::from_secs(60), 64);
        // Nothing asked: nothing sampled, however long.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(lock(&sampler.samples).is_empty());
        // Asked once: sampled at once (the cache is empty; the second node half of the half
        // interval later) and every 15 s for the next minute.
        demand.ask("node-b");
        demand.ask("node-a");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*lock(&sampler.samples), ["node-a"]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(*lock(&sampler.samples), ["node-a", "node-b"]);
        tokio::time::sleep(Duration::from_secs(56)).await;
        assert_eq!(lock(&sampler.samples).len(), 8, "rounds at 0, 15, 30 and 45 s");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(lock(&sampler.samples).len(), 8, "idle: no more samples");
        assert!(lock(&demand.asked).is_empty(), "idle nodes are forgotten");
        // A fresh cache entry is not sampled again.
        sampler.fresh.store(1, Ordering::SeqCst);
        demand.ask("node-a");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(lock(&sampler.samples).len(), 8);
        // A node that left is forgotten.
        demand.forget("node-a");
        assert!(demand.recent(Duration::from_secs(60)).is_empty());
        task.abort();
    }

    /// Records each refresh when it starts; `node-slow` hangs for 100 s, as a kubelet that
    /// answers nothing until the request timeout.
    #[derive(Default)]
    struct OneHangs {
        started: Mutex<Vec<String>>,
    }

    impl Sampler for OneHangs {
        async fn refresh(&self, node: &str, _age: Duration) {
            lock(&self.started).push(node.to_owned());
            if node == "node-slow" {
                tokio::time::sleep(Duration::from_secs(100)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_node_holds_back_neither_the_others_nor_gets_a_second_fetch() {
        let sampler = Arc::new(OneHangs::default());
        let demand = Arc::new(Demand::default());
        let task = start(&sampler, &demand, Duration::from_secs(300), 64);
        demand.ask("node-slow");
        demand.ask("node-fast");
        tokio::time::sleep(Duration::from_secs(61)).await;
        let count = |node: &str| lock(&sampler.started).iter().filter(|n| *n == node).count();
        assert_eq!(count("node-fast"), 5, "rounds at 0, 15, 30, 45 and 60 s while the other hangs");
        assert_eq!(count("node-slow"), 1, "one fetch in flight at a time");
        // Once its refresh ends (at 103.75 s: it started second in its round), the next round
        // takes it again, first (it was sampled longest ago), and node-fast 3.75 s later.
        tokio::time::sleep(Duration::from_secs(48)).await;
        assert_eq!(count("node-slow"), 2, "sampled again at 105 s");
        assert_eq!(count("node-fast"), 8, "at 0, 15, …, 90 and 108.75 s");
        task.abort();
    }

    /// Each refresh takes 2.9 s; records how many run at once and how often each node was taken.
    #[derive(Default)]
    struct Slow {
        running: AtomicUsize,
        most: AtomicUsize,
        taken: Mutex<HashMap<String, usize>>,
    }

    impl Sampler for Slow {
        async fn refresh(&self, node: &str, _age: Duration) {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            *lock(&self.taken).entry(node.to_owned()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(2900)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_run_at_most_the_limit_at_once_and_every_node_takes_its_turn_when_behind() {
        let sampler = Arc::new(Slow::default());
        let demand = Arc::new(Demand::default());
        let task = start(&sampler, &demand, Duration::from_secs(300), 2);
        for i in 0..20 {
            demand.ask(&format!("node-{i:02}"));
        }
        // Two at a time, 2.9 s each: the 20 nodes take 29 s, about two intervals, so every
        // round finds nodes of the last one still queued and adds none of them twice.
        tokio::time::sleep(Duration::from_millis(28_500)).await;
        let taken = lock(&sampler.taken).clone();
        assert_eq!(taken.len(), 20, "every node taken once before any twice: {taken:?}");
        assert!(taken.values().all(|n| *n == 1), "{taken:?}");
        // Falling behind for minutes, every node is still taken in turn.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_secs(15)).await;
            let taken = lock(&sampler.taken).clone();
            let (least, most) = (taken.values().min().unwrap(), taken.values().max().unwrap());
            assert!(most - least <= 1, "no node waits a turn more than the others: {taken:?}");
        }
        assert!(lock(&sampler.taken).values().all(|n| *n >= 5), "{:?}", lock(&sampler.taken));
        assert_eq!(sampler.most.load(Ordering::SeqCst), 2, "never more than the limit at once");
        task.abort();
    }

    /// Each refresh takes 100 ms; records when each started (ms after `zero`) and how many
    /// ran at once.
    struct Timed {
        zero: Instant,
        running: AtomicUsize,
        most: AtomicUsize,
        started: Mutex<Vec<(String, u128)>>,
    }

    impl Sampler for Timed {
        async fn refresh(&self, node: &str, _age: Duration) {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let at = Instant::now().duration_since(self.zero).as_millis();
            lock(&self.started).push((node.to_owned(), at));
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rounds_refreshes_are_paced_over_half_an_interval_and_keep_their_places() {
        let sampler = Arc::new(Timed {
            zero: Instant::now(),
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            started: Mutex::new(Vec::new()),
        });
        let demand = Arc::new(Demand::default());
        let task = start(&sampler, &demand, Duration::from_secs(300), 64);
        for i in (0..10).rev() {
            demand.ask(&format!("node-{i}"));
        }
        // Three rounds (0, 15 and 30 s), each launching its ten nodes 750 ms apart over the
        // first 7.5 s, in the same order.
        tokio::time::sleep(Duration::from_millis(44_000)).await;
        let started = lock(&sampler.started).clone();
        assert_eq!(started.len(), 30, "{started:?}");
        for (n, (node, at)) in started.iter().enumerate() {
            let (round, place) = (n / 10, n % 10);
            assert_eq!(node, &format!("node-{place}"), "the same place in every round: {started:?}");
            let want = u128::try_from(round * 15_000 + place * 750).unwrap();
            assert!(at.abs_diff(want) <= 5, "{node} of round {round} at {at} ms, not {want}: {started:?}");
        }
        assert_eq!(sampler.most.load(Ordering::SeqCst), 1, "one fetch at a time, not a burst");
        task.abort();
    }
}
