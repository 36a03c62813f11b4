//! Timer index benchmarks (issue 2, acceptance items 3 and 4).
//!
//! The full timer lifecycle: insert N timers with deadlines uniform over
//! 1 ms..=60 s (1 tick = 1 ms, so deadlines `1..=60_000` from tick 0), cancel
//! every second one (in insertion order), then expire the rest, driven
//!
//! * `jump`: by one advance past every deadline, or
//! * `steps4`: in 4-tick steps (4, 8, 12, ...) until nothing is pending, as the
//!   eviction thread drives it.
//!
//! Also `insert_cancel`: insert N, then cancel all of them (insertion order).
//!
//! Contenders, all fed the same pre-generated deadlines (one seed) and all
//! carrying a `u32` payload (the timer's index):
//!
//! * `wheel_r1` .. `wheel_r6`: `expiremap::timer::TimerWheel<u32, R>`;
//! * `binary_heap`: `BinaryHeap<(Reverse(deadline), id)>` with tombstones (a
//!   `Vec<bool>` of pending flags; cancelled entries are skipped when popped);
//! * `btree_map`: `BTreeMap<deadline, Vec<id>>` (cancel removes the id from
//!   its deadline's `Vec`, and the key when the `Vec` empties);
//! * `delay_queue`: tokio-util's `DelayQueue` on a paused current-thread tokio
//!   clock (`insert_at`, `remove`, and `tokio::time::advance` + `poll_expired`).
//!
//! Each structure starts empty (no pre-sizing) in every iteration; handle
//! vectors are pre-allocated and building/dropping the structure is outside
//! the timed region. Criterion reports the whole lifecycle; the per-phase
//! times (insert / cancel / expire) of every iteration are recorded on the
//! side and printed as a table of medians, in ns per timer, at the end.
//!
//! Before benchmarking, every contender is checked against the expected fire
//! set: in `steps4`, timer `d` must fire at the step `ceil(d / 4) * 4`.
//!
//! `TIMER_INTERLEAVED=1` replaces the criterion run by a round-robin one
//! (every contender once per round) that prints min and median ns per timer:
//! on a shared, noisy machine it compares contenders under the same load.
//! `TIMER_INTERLEAVED=warm` does the same for the wheels only, each starting
//! from a pre-sized slab whose free list is scrambled (a long-running map's
//! state), so that the choice of R does not rest on a fresh slab's locality.
//!
//! `TIMER_ONESHOT="<contender> <jump|steps4|insert_cancel> <N>"` runs one
//! iteration and exits (for `valgrind --tool=callgrind`; the measured work is
//! in the `#[inline(never)]` functions named `run_*`).

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use expiremap::timer::{TimerId, TimerWheel};
use expiremap_benches::SplitMix64;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::future::poll_fn;
use std::hint::black_box;
use std::sync::Mutex;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio_util::time::DelayQueue;

const SEED: u64 = 0x7153_2002_0000_0001;
/// Deadlines are uniform in `1..=MAX_DEADLINE` ticks (ms).
const MAX_DEADLINE: u64 = 60_000;
/// Tick step of the `steps4` drive.
const STEP: u64 = 4;
const SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Insert, cancel every second one, one jump past every deadline.
    Jump,
    /// Insert, cancel every second one, advance in `STEP`-tick steps.
    Steps,
    /// Insert, cancel all.
    InsertCancel,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Jump => "lifecycle_jump",
            Mode::Steps => "lifecycle_steps4",
            Mode::InsertCancel => "insert_cancel",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "jump" | "lifecycle_jump" => Some(Mode::Jump),
            "steps4" | "lifecycle_steps4" => Some(Mode::Steps),
            "insert_cancel" => Some(Mode::InsertCancel),
            _ => None,
        }
    }

    /// Whether timer `i` gets cancelled.
    #[inline]
    fn cancels(self, i: usize) -> bool {
        self == Mode::InsertCancel || i % 2 == 1
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rival {
    Wheel(u32),
    /// The wheel with a "warm", scrambled slab: before the timed part, N
    /// placeholder timers are inserted and cancelled in random order, so the
    /// slab is pre-sized and its free list hands out slots in random order,
    /// as in a long-running map. Only in `TIMER_INTERLEAVED=warm`.
    WarmWheel(u32),
    Heap,
    BTree,
    DelayQueue,
}

const WARM_WHEELS: [Rival; 6] = [
    Rival::WarmWheel(1),
    Rival::WarmWheel(2),
    Rival::WarmWheel(3),
    Rival::WarmWheel(4),
    Rival::WarmWheel(5),
    Rival::WarmWheel(6),
];

const RIVALS: [Rival; 9] = [
    Rival::Wheel(1),
    Rival::Wheel(2),
    Rival::Wheel(3),
    Rival::Wheel(4),
    Rival::Wheel(5),
    Rival::Wheel(6),
    Rival::Heap,
    Rival::BTree,
    Rival::DelayQueue,
];

impl Rival {
    fn name(self) -> String {
        match self {
            Rival::Wheel(r) => format!("wheel_r{r}"),
            Rival::WarmWheel(r) => format!("wheel_r{r}_warm"),
            Rival::Heap => "binary_heap".into(),
            Rival::BTree => "btree_map".into(),
            Rival::DelayQueue => "delay_queue".into(),
        }
    }

    fn parse(s: &str) -> Option<Rival> {
        RIVALS
            .into_iter()
            .chain(WARM_WHEELS)
            .find(|r| r.name() == s)
    }
}

/// What one run measured.
#[derive(Clone, Copy, Default, Debug)]
struct Phases {
    insert: Duration,
    cancel: Duration,
    expire: Duration,
    /// Successful cancels.
    cancelled: usize,
}

impl Phases {
    fn total(&self) -> Duration {
        self.insert + self.cancel + self.expire
    }
}

/// Deadlines for one N, from one seed: the same inputs for every contender.
fn deadlines(n: usize) -> Vec<u64> {
    let mut rng = SplitMix64(SEED ^ n as u64);
    (0..n).map(|_| rng.range(1, MAX_DEADLINE)).collect()
}

// ---- contenders ----------------------------------------------------------
//
// `fire(now, payload)` is called for every timer that fires, with the tick the
// structure was advanced to.

#[inline(never)]
fn run_wheel<const R: u32>(
    d: &[u64],
    mode: Mode,
    warm: bool,
    fire: &mut impl FnMut(u64, u32),
) -> Phases {
    let mut ids: Vec<TimerId> = Vec::with_capacity(d.len());
    let mut w = TimerWheel::<u32, R>::with_level_bits(0);
    if warm {
        ids.extend((0..d.len()).map(|_| w.insert(u64::MAX, 0)));
        let mut rng = SplitMix64(SEED.rotate_left(17));
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.range(0, i as u64) as usize);
        }
        for id in ids.drain(..) {
            w.cancel(id);
        }
    }
    let mut p = Phases::default();

    let t0 = Instant::now();
    for (i, &dl) in d.iter().enumerate() {
        ids.push(w.insert(dl, i as u32));
    }
    let t1 = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        if mode.cancels(i) && w.cancel(*id).is_some() {
            p.cancelled += 1;
        }
    }
    let t2 = Instant::now();
    match mode {
        Mode::Jump => w.advance(MAX_DEADLINE + 1, |_, v| fire(MAX_DEADLINE + 1, v)),
        Mode::Steps => {
            let mut now = 0;
            while !w.is_empty() {
                now += STEP;
                w.advance(now, |_, v| fire(now, v));
            }
        }
        Mode::InsertCancel => {}
    }
    let t3 = Instant::now();
    assert!(w.is_empty());
    p.insert = t1 - t0;
    p.cancel = t2 - t1;
    p.expire = t3 - t2;
    drop(black_box(w));
    p
}

#[inline(never)]
fn run_heap(d: &[u64], mode: Mode, fire: &mut impl FnMut(u64, u32)) -> Phases {
    let mut ids: Vec<u32> = Vec::with_capacity(d.len());
    let mut heap: BinaryHeap<(Reverse<u64>, u32)> = BinaryHeap::new();
    // Pending flag per id; a cancelled entry stays in the heap as a tombstone.
    let mut pending: Vec<bool> = Vec::new();
    let mut live = 0usize;
    let mut p = Phases::default();

    let t0 = Instant::now();
    for &dl in d {
        let id = pending.len() as u32;
        pending.push(true);
        heap.push((Reverse(dl), id));
        live += 1;
        ids.push(id);
    }
    let t1 = Instant::now();
    for (i, &id) in ids.iter().enumerate() {
        if mode.cancels(i) && std::mem::take(&mut pending[id as usize]) {
            live -= 1;
            p.cancelled += 1;
        }
    }
    let t2 = Instant::now();
    let mut expire = |now: u64, heap: &mut BinaryHeap<(Reverse<u64>, u32)>, live: &mut usize| {
        while let Some(&(Reverse(dl), id)) = heap.peek() {
            if dl > now {
                break;
            }
            heap.pop();
            if std::mem::take(&mut pending[id as usize]) {
                *live -= 1;
                fire(now, id);
            }
        }
    };
    match mode {
        Mode::Jump => expire(MAX_DEADLINE + 1, &mut heap, &mut live),
        Mode::Steps => {
            let mut now = 0;
            while live != 0 {
                now += STEP;
                expire(now, &mut heap, &mut live);
            }
        }
        Mode::InsertCancel => {}
    }
    let t3 = Instant::now();
    assert_eq!(live, 0);
    p.insert = t1 - t0;
    p.cancel = t2 - t1;
    p.expire = t3 - t2;
    drop(black_box(heap));
    p
}

#[inline(never)]
fn run_btree(d: &[u64], mode: Mode, fire: &mut impl FnMut(u64, u32)) -> Phases {
    let mut ids: Vec<(u64, u32)> = Vec::with_capacity(d.len());
    let mut map: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut p = Phases::default();

    let t0 = Instant::now();
    for (i, &dl) in d.iter().enumerate() {
        map.entry(dl).or_default().push(i as u32);
        ids.push((dl, i as u32));
    }
    let t1 = Instant::now();
    for (i, &(dl, id)) in ids.iter().enumerate() {
        if !mode.cancels(i) {
            continue;
        }
        let Some(v) = map.get_mut(&dl) else { continue };
        let Some(pos) = v.iter().position(|&x| x == id) else {
            continue;
        };
        v.swap_remove(pos);
        if v.is_empty() {
            map.remove(&dl);
        }
        p.cancelled += 1;
    }
    let t2 = Instant::now();
    let mut expire = |now: u64, map: &mut BTreeMap<u64, Vec<u32>>| {
        while let Some(e) = map.first_entry() {
            if *e.key() > now {
                break;
            }
            for id in e.remove() {
                fire(now, id);
            }
        }
    };
    match mode {
        Mode::Jump => expire(MAX_DEADLINE + 1, &mut map),
        Mode::Steps => {
            let mut now = 0;
            while !map.is_empty() {
                now += STEP;
                expire(now, &mut map);
            }
        }
        Mode::InsertCancel => {}
    }
    let t3 = Instant::now();
    assert!(map.is_empty());
    p.insert = t1 - t0;
    p.cancel = t2 - t1;
    p.expire = t3 - t2;
    drop(black_box(map));
    p
}

/// A current-thread runtime with only the time driver, its clock paused.
fn paused_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("tokio runtime")
}

/// Pops every expired entry; `true` once the queue is exhausted.
///
/// Polled `unconstrained`: otherwise tokio's cooperative budget (128 timer
/// polls per task poll) makes `poll_expired` return `Pending` while expired
/// entries remain, and a step would not fire everything that is due.
async fn dq_drain(q: &mut DelayQueue<u32>, now: u64, fire: &mut impl FnMut(u64, u32)) -> bool {
    tokio::task::unconstrained(poll_fn(|cx| {
        loop {
            match q.poll_expired(cx) {
                Poll::Ready(Some(e)) => fire(now, e.into_inner()),
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Pending => return Poll::Ready(false),
            }
        }
    }))
    .await
}

#[inline(never)]
fn run_delay_queue(rt: &Runtime, d: &[u64], mode: Mode, fire: &mut impl FnMut(u64, u32)) -> Phases {
    rt.block_on(async {
        let mut keys = Vec::with_capacity(d.len());
        let mut q: DelayQueue<u32> = DelayQueue::new();
        // The clock is paused: this is the queue's own start instant.
        let start = tokio::time::Instant::now();
        let mut p = Phases::default();

        let t0 = Instant::now();
        for (i, &dl) in d.iter().enumerate() {
            keys.push(q.insert_at(i as u32, start + Duration::from_millis(dl)));
        }
        let t1 = Instant::now();
        for (i, k) in keys.iter().enumerate() {
            if mode.cancels(i) {
                black_box(q.remove(k));
                p.cancelled += 1;
            }
        }
        let t2 = Instant::now();
        match mode {
            Mode::Jump => {
                tokio::time::advance(Duration::from_millis(MAX_DEADLINE + 1)).await;
                let done = dq_drain(&mut q, MAX_DEADLINE + 1, fire).await;
                assert!(done);
            }
            Mode::Steps => {
                let mut now = 0;
                while !q.is_empty() {
                    now += STEP;
                    tokio::time::advance(Duration::from_millis(STEP)).await;
                    dq_drain(&mut q, now, fire).await;
                }
            }
            Mode::InsertCancel => {}
        }
        let t3 = Instant::now();
        assert!(q.is_empty());
        p.insert = t1 - t0;
        p.cancel = t2 - t1;
        p.expire = t3 - t2;
        drop(black_box(q));
        p
    })
}

fn run(
    rival: Rival,
    rt: &Runtime,
    d: &[u64],
    mode: Mode,
    fire: &mut impl FnMut(u64, u32),
) -> Phases {
    match rival {
        Rival::Wheel(1) => run_wheel::<1>(d, mode, false, fire),
        Rival::WarmWheel(1) => run_wheel::<1>(d, mode, true, fire),
        Rival::Wheel(2) => run_wheel::<2>(d, mode, false, fire),
        Rival::WarmWheel(2) => run_wheel::<2>(d, mode, true, fire),
        Rival::Wheel(3) => run_wheel::<3>(d, mode, false, fire),
        Rival::WarmWheel(3) => run_wheel::<3>(d, mode, true, fire),
        Rival::Wheel(4) => run_wheel::<4>(d, mode, false, fire),
        Rival::WarmWheel(4) => run_wheel::<4>(d, mode, true, fire),
        Rival::Wheel(5) => run_wheel::<5>(d, mode, false, fire),
        Rival::WarmWheel(5) => run_wheel::<5>(d, mode, true, fire),
        Rival::Wheel(6) => run_wheel::<6>(d, mode, false, fire),
        Rival::WarmWheel(6) => run_wheel::<6>(d, mode, true, fire),
        Rival::Wheel(r) | Rival::WarmWheel(r) => unreachable!("R = {r}"),
        Rival::Heap => run_heap(d, mode, fire),
        Rival::BTree => run_btree(d, mode, fire),
        Rival::DelayQueue => run_delay_queue(rt, d, mode, fire),
    }
}

/// One run with a counting `fire`; checks the counts.
fn run_counted(rival: Rival, rt: &Runtime, d: &[u64], mode: Mode) -> Phases {
    let (mut fired, mut sum) = (0usize, 0u64);
    let p = run(rival, rt, d, mode, &mut |_, v| {
        fired += 1;
        sum = sum.wrapping_add(u64::from(v));
    });
    black_box(sum);
    let cancelled = (0..d.len()).filter(|&i| mode.cancels(i)).count();
    assert_eq!(p.cancelled, cancelled, "{} {mode:?}", rival.name());
    assert_eq!(fired, d.len() - cancelled, "{} {mode:?}", rival.name());
    p
}

/// Checks every contender fires exactly the expected `(tick, timer)` set.
fn validate(rt: &Runtime) {
    let d = deadlines(20_000);
    for mode in [Mode::Jump, Mode::Steps, Mode::InsertCancel] {
        let mut expected: Vec<(u64, u32)> = d
            .iter()
            .enumerate()
            .filter(|&(i, _)| !mode.cancels(i))
            .map(|(i, &dl)| {
                let at = match mode {
                    Mode::Jump => MAX_DEADLINE + 1,
                    _ => dl.div_ceil(STEP) * STEP,
                };
                (at, i as u32)
            })
            .collect();
        expected.sort_unstable();
        for rival in RIVALS.into_iter().chain(WARM_WHEELS) {
            let mut got = Vec::new();
            run(rival, rt, &d, mode, &mut |now, v| got.push((now, v)));
            got.sort_unstable();
            assert!(got == expected, "{} {mode:?}: wrong fire set", rival.name());
        }
    }
}

// ---- criterion -------------------------------------------------------------

type PhaseLog = Vec<((Mode, usize, Rival), Vec<Phases>)>;
static PHASES: Mutex<PhaseLog> = Mutex::new(Vec::new());

fn record(key: (Mode, usize, Rival), p: Phases) {
    let mut log = PHASES.lock().unwrap();
    match log.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(p),
        None => log.push((key, vec![p])),
    }
}

fn n_label(n: usize) -> String {
    format!("1e{}", n.ilog10())
}

fn bench_group(g: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, d: &[u64], mode: Mode) {
    for rival in RIVALS {
        g.bench_function(rival.name(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let p = run_counted(rival, rt, d, mode);
                    record((mode, d.len(), rival), p);
                    total += p.total();
                }
                total
            })
        });
    }
}

fn benches(c: &mut Criterion, rt: &Runtime) {
    for mode in [Mode::Jump, Mode::Steps, Mode::InsertCancel] {
        for n in SIZES {
            let d = deadlines(n);
            let mut g = c.benchmark_group(format!("{}_{}", mode.name(), n_label(n)));
            g.throughput(Throughput::Elements(n as u64))
                .sample_size(10)
                .sampling_mode(SamplingMode::Flat);
            match n {
                10_000 => g
                    .warm_up_time(Duration::from_millis(500))
                    .measurement_time(Duration::from_millis(1500)),
                100_000 => g
                    .warm_up_time(Duration::from_millis(500))
                    .measurement_time(Duration::from_secs(2)),
                _ => g
                    .warm_up_time(Duration::from_secs(1))
                    .measurement_time(Duration::from_secs(4)),
            };
            bench_group(&mut g, rt, &d, mode);
            g.finish();
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Prints the per-phase medians (ns per timer) of every recorded iteration.
fn print_phases() {
    let log = PHASES.lock().unwrap();
    if log.is_empty() {
        return;
    }
    println!("\nPhase medians over all recorded iterations, ns per timer (N timers inserted):");
    println!("| group | contender | iters | insert | cancel | expire | total |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for ((mode, n, rival), runs) in log.iter() {
        let per = |f: &dyn Fn(&Phases) -> Duration| {
            median(runs.iter().map(f).collect()).as_nanos() as f64 / *n as f64
        };
        println!(
            "| {}_{} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            mode.name(),
            n_label(*n),
            rival.name(),
            runs.len(),
            per(&|p| p.insert),
            per(&|p| p.cancel),
            per(&|p| p.expire),
            per(&|p| p.total()),
        );
    }
}

fn oneshot(spec: &str, rt: &Runtime) {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let [rival, mode, n] = parts[..] else {
        panic!("TIMER_ONESHOT=\"<contender> <jump|steps4|insert_cancel> <N>\"");
    };
    let rival = Rival::parse(rival).expect("unknown contender");
    let mode = Mode::parse(mode).expect("unknown mode");
    let n: usize = n.parse().expect("N");
    let d = deadlines(n);
    let p = run_counted(rival, rt, &d, mode);
    println!(
        "{} {} {n}: insert {:?} cancel {:?} expire {:?}",
        rival.name(),
        mode.name(),
        p.insert,
        p.cancel,
        p.expire
    );
}

/// Round-robin comparison for a noisy machine: every contender runs once per
/// round (the starting contender rotates), so all of them see the same
/// background load; prints min and median ns per timer over the rounds, and
/// the median of each phase. One discarded warm-up round first.
fn interleaved(rt: &Runtime, rivals: &[Rival]) {
    println!(
        "| group | contender | rounds | min total | median total | insert | cancel | expire |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for mode in [Mode::Jump, Mode::Steps, Mode::InsertCancel] {
        for n in SIZES {
            let d = deadlines(n);
            let rounds = match n {
                10_000 => 101,
                100_000 => 31,
                _ => 11,
            };
            let mut runs: Vec<Vec<Phases>> = vec![Vec::new(); rivals.len()];
            for round in 0..=rounds {
                for k in 0..rivals.len() {
                    let i = (k + round) % rivals.len();
                    let p = run_counted(rivals[i], rt, &d, mode);
                    if round > 0 {
                        runs[i].push(p);
                    }
                }
            }
            for (rival, runs) in rivals.iter().zip(runs) {
                let ns = |t: Duration| t.as_nanos() as f64 / n as f64;
                let med =
                    |f: &dyn Fn(&Phases) -> Duration| ns(median(runs.iter().map(f).collect()));
                let min = runs.iter().map(Phases::total).min().unwrap();
                println!(
                    "| {}_{} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    mode.name(),
                    n_label(n),
                    rival.name(),
                    runs.len(),
                    ns(min),
                    med(&|p| p.total()),
                    med(&|p| p.insert),
                    med(&|p| p.cancel),
                    med(&|p| p.expire),
                );
            }
        }
    }
}

fn main() {
    let rt = paused_runtime();
    if let Ok(spec) = std::env::var("TIMER_ONESHOT") {
        oneshot(&spec, &rt);
        return;
    }
    if let Ok(which) = std::env::var("TIMER_INTERLEAVED") {
        validate(&rt);
        let rivals: &[Rival] = if which == "warm" {
            &WARM_WHEELS
        } else {
            &RIVALS
        };
        interleaved(&rt, rivals);
        return;
    }
    validate(&rt);
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &rt);
    c.final_summary();
    print_phases();
}
