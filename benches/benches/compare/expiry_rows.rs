//! The rows about expiry: memory reclaimed after entries expire (with and
//! without a subscriber), bursts of deadlines, and eviction lateness.

use super::*;

// ---------------------------------------------------------------------------
// Row 6: reclaim.

pub(super) struct Reclaim {
    /// The insert loop.
    fill: Duration,
    /// `count()` right after the insert loop (moka, mini-moka: their
    /// approximate count, before any maintenance call).
    held_at_fill_end: u64,
    /// End of the insert loop -> `count() == 0` observed.
    drain: Duration,
    /// First deadline (insert loop start + TTL) -> empty.
    from_first_deadline: Duration,
    /// Last deadline (insert loop end + TTL) -> empty.
    from_last_deadline: Duration,
    /// `count()` at the first poll after the last deadline passed (every
    /// entry expired by then): the backlog the eviction had left.
    held_at_last_deadline: u64,
    emptied: bool,
    /// Subscriber: events received, events lost as `Lagged`.
    events: Option<(u64, u64)>,
}

/// Drains a subscriber with `try_recv_batch`, falling back to a blocking
/// `recv` when nothing is ready. Returns (events, lagged) at `Closed`.
pub(super) fn drain_events(mut sub: Subscriber<u64, u64>) -> (u64, u64) {
    let (mut events, mut lagged) = (0u64, 0u64);
    let mut buf = Vec::with_capacity(1024);
    loop {
        match sub.try_recv_batch(&mut buf, 1024) {
            Ok(n) => {
                events += n as u64;
                black_box(&buf);
                buf.clear();
            }
            Err(TryRecvError::Lagged(n)) => lagged += n,
            Err(TryRecvError::Closed) => break,
            Err(TryRecvError::Empty) => match sub.recv() {
                Ok(e) => {
                    black_box(e);
                    events += 1;
                }
                Err(RecvError::Lagged(n)) => lagged += n,
                Err(RecvError::Closed) => break,
            },
        }
    }
    (events, lagged)
}

pub(super) fn reclaim_once<S: Subject>(
    attach: impl FnOnce(&S) -> Option<thread::JoinHandle<(u64, u64)>>,
) -> Reclaim {
    let m = S::build(RECLAIM_TTL);
    let drainer = attach(&m);
    let start = Instant::now();
    fill(&m, RECLAIM_TTL);
    let fill_end = Instant::now();
    let held_at_fill_end = m.count();
    let last_deadline = fill_end + RECLAIM_TTL;
    let mut held_at_last_deadline = None;
    let mut emptied = true;
    loop {
        m.maintain();
        let held = m.count();
        if held_at_last_deadline.is_none() && Instant::now() >= last_deadline {
            held_at_last_deadline = Some(held);
        }
        if held == 0 {
            break;
        }
        if fill_end.elapsed() > PATIENCE {
            emptied = false;
            break;
        }
        if S::SELF_EVICTING {
            // Poll without competing for the shard locks.
            thread::sleep(Duration::from_micros(100));
        }
    }
    let empty = Instant::now();
    drop(m);
    let events = drainer.map(|h| h.join().unwrap());
    Reclaim {
        fill: fill_end - start,
        held_at_fill_end,
        drain: empty - fill_end,
        from_first_deadline: empty.saturating_duration_since(start + RECLAIM_TTL),
        from_last_deadline: empty.saturating_duration_since(last_deadline),
        held_at_last_deadline: held_at_last_deadline.unwrap_or(0),
        emptied,
        events,
    }
}

pub(super) fn reclaim_report(col: &'static str, runs: &mut [Reclaim]) {
    runs.sort_by_key(|r| r.drain);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for r in runs.iter() {
        println!(
            "reclaim {:<15} fill {:>7.1} ms, held at fill end {:>7}, fill end -> empty {:>7.1} ms \
             ({:>5.2} M/s), first deadline -> empty {:>7.1} ms ({:>5.2} M/s), held at last \
             deadline {:>7}, last deadline -> empty {:>6.1} ms{}{}",
            col,
            ms(r.fill),
            r.held_at_fill_end,
            ms(r.drain),
            N as f64 / r.drain.as_secs_f64() / 1e6,
            ms(r.from_first_deadline),
            N as f64 / r.from_first_deadline.as_secs_f64() / 1e6,
            r.held_at_last_deadline,
            ms(r.from_last_deadline),
            if r.emptied { "" } else { "  NOT EMPTY" },
            r.events
                .map(|(e, l)| format!(", subscriber: {e} events, {l} lagged"))
                .unwrap_or_default()
        );
    }
    let med = &runs[runs.len() / 2];
    record("reclaim", col, N as f64 / med.drain.as_secs_f64() / 1e6);
    record(
        "reclaim_e2e",
        col,
        N as f64 / med.from_first_deadline.as_secs_f64() / 1e6,
    );
    record("reclaim_fill", col, med.fill.as_secs_f64() * 1e3);
    record("reclaim_backlog", col, med.held_at_last_deadline as f64);
}

pub(super) fn reclaim_row<S: Subject>(sel: &Select) {
    if !S::EXPIRES || !sel.lib(S::NAME) || !sel.row("reclaim") {
        return;
    }
    let mut runs: Vec<Reclaim> = (0..RECLAIM_RUNS)
        .map(|_| reclaim_once::<S>(|_| None))
        .collect();
    reclaim_report(S::NAME, &mut runs);
}

pub(super) fn reclaim_subscribed(sel: &Select) {
    if !sel.lib("expiremap+sub") || !sel.row("reclaim") {
        return;
    }
    let mut runs: Vec<Reclaim> = (0..RECLAIM_RUNS)
        .map(|_| {
            reclaim_once::<Em>(|m| {
                let sub = m.0.subscribe().expect("subscribe");
                Some(thread::spawn(move || drain_events(sub)))
            })
        })
        .collect();
    reclaim_report("expiremap+sub", &mut runs);
}

// ---------------------------------------------------------------------------
// Row 6b (supplementary): burst reclaim. With one inserting thread and a
// 50 ms TTL, a library whose eviction keeps up with its own insert rate
// never builds a backlog, so row 6 cannot show eviction throughput. Here
// every entry gets the per-entry TTL that puts its deadline at one common
// instant `due`, after the fill: from `due` on, 10^6 expired entries wait.
// Only libraries with per-entry TTLs can do this (ExpireMap, moka
// `expire_after`).

/// moka expiry for the burst: every entry is due at `due`.
pub(super) struct DueAt(Instant);

impl Expiry<u64, u64> for DueAt {
    fn expire_after_create(&self, _: &u64, _: &u64, at: Instant) -> Option<Duration> {
        Some(
            self.0
                .saturating_duration_since(at)
                .max(Duration::from_nanos(1)),
        )
    }
}

/// Fills `m` so that every entry is due at `due` (which the fill must not
/// reach), then times `due` -> empty. Returns (deadline -> empty, fill, overran, held at
/// the first poll after the deadline).
pub(super) fn burst_once<S: Subject>(
    m: S,
    due: Instant,
    per_entry_ttl: bool,
    drainer: Option<thread::JoinHandle<(u64, u64)>>,
) -> (Duration, Duration, bool, u64, Option<(u64, u64)>) {
    let start = Instant::now();
    for i in 0..N {
        let ttl = if per_entry_ttl {
            due.saturating_duration_since(Instant::now())
                .max(Duration::from_nanos(1))
        } else {
            LONG_TTL // ignored: the map's Expiry decides
        };
        m.insert(key(i), i, ttl);
    }
    let fill = start.elapsed();
    let overran = Instant::now() >= due;
    thread::sleep(due.saturating_duration_since(Instant::now()));
    // Before any maintenance call (moka: its approximate count).
    let held_at_due = m.count();
    loop {
        m.maintain();
        if m.count() == 0 || due.elapsed() > PATIENCE {
            break;
        }
        if S::SELF_EVICTING {
            thread::sleep(Duration::from_micros(100));
        }
    }
    let took = due.elapsed();
    drop(m);
    let events = drainer.map(|h| h.join().unwrap());
    (took, fill, overran, held_at_due, events)
}

pub(super) fn burst_report(
    col: &'static str,
    (took, fill, overran, held, events): (Duration, Duration, bool, u64, Option<(u64, u64)>),
) {
    let rate = N as f64 / took.as_secs_f64() / 1e6;
    println!(
        "burst   {col:<15} fill {:>7.1} ms{}, held at the deadline {held:>7}, deadline -> empty \
         {:>7.1} ms ({rate:>5.2} M/s){}",
        fill.as_secs_f64() * 1e3,
        if overran {
            " (OVERRAN the deadline)"
        } else {
            ""
        },
        took.as_secs_f64() * 1e3,
        events
            .map(|(e, l)| format!(", subscriber: {e} events, {l} lagged"))
            .unwrap_or_default()
    );
    if !overran {
        record("burst", col, rate);
    }
}

pub(super) fn burst_rows(sel: &Select) {
    if !sel.row("burst") {
        return;
    }
    // Leads: several times each library's fill time on this machine.
    let em_lead = Duration::from_secs(2);
    if sel.lib("expiremap") {
        let due = Instant::now() + em_lead;
        let r = burst_once(Em::build(LONG_TTL), due, true, None);
        burst_report("expiremap", r);
    }
    if sel.lib("expiremap+sub") {
        let m = Em::build(LONG_TTL);
        let sub = m.0.subscribe().expect("subscribe");
        let drainer = thread::spawn(move || drain_events(sub));
        let due = Instant::now() + em_lead;
        let r = burst_once(m, due, true, Some(drainer));
        burst_report("expiremap+sub", r);
    }
    if sel.lib("moka-expire") {
        let due = Instant::now() + Duration::from_secs(8);
        let m = Moka::<true>(
            moka::sync::Cache::builder()
                .max_capacity(N)
                .expire_after(DueAt(due))
                .build_with_hasher(ahash::RandomState::new()),
        );
        let r = burst_once(m, due, false, None);
        burst_report("moka-expire", r);
    }
}

// ---------------------------------------------------------------------------
// Row 7: lateness.

/// p50, p99 and max of `late_ns`, in ms (sorts it).
pub(super) fn quantiles(late_ns: &mut [u64]) -> Option<(f64, f64, f64)> {
    if late_ns.is_empty() {
        return None;
    }
    late_ns.sort_unstable();
    let at = |p: usize| late_ns[(late_ns.len() * p).div_ceil(100).max(1) - 1] as f64 / 1e6;
    Some((at(50), at(99), at(100)))
}

/// Prints one lateness line and, if `record_as` is set, records the cells.
pub(super) fn lateness_report(
    col: &'static str,
    what: &str,
    mut late_ns: Vec<u64>,
    lost: u64,
    record_as: bool,
) {
    let Some((p50, p99, max)) = quantiles(&mut late_ns) else {
        println!("late    {col:<15} {what}: no events, {lost} lost");
        return;
    };
    println!(
        "late    {col:<15} {what}: {} events, p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms, \
         lost/lagged {lost}",
        late_ns.len()
    );
    if record_as {
        record("late_p50", col, p50);
        record("late_p99", col, p99);
        record("late_max", col, max);
    }
}

/// Subscriber side of row 7: every event is timestamped with `clock` when
/// its batch is observed. Returns (observed lateness, map's own
/// `removed_at - deadline`, deadlines, lagged, events seen before their
/// deadline).
pub(super) fn observe(
    mut sub: Subscriber<u64, u64>,
    clock: SystemClock,
) -> (Vec<u64>, Vec<u64>, Vec<u64>, u64, u64) {
    let mut deadlines = Vec::with_capacity(N as usize);
    let mut observed = Vec::with_capacity(N as usize);
    let mut own = Vec::with_capacity(N as usize);
    let (mut lagged, mut early) = (0u64, 0u64);
    let mut buf = Vec::with_capacity(4096);
    while (observed.len() as u64) + lagged < N {
        match sub.try_recv_batch(&mut buf, 4096) {
            Ok(_) => {}
            Err(TryRecvError::Lagged(n)) => lagged += n,
            Err(TryRecvError::Closed) => break,
            Err(TryRecvError::Empty) => match sub.recv_timeout(PATIENCE) {
                Ok(e) => buf.push(e),
                Err(RecvTimeoutError::Lagged(n)) => lagged += n,
                Err(_) => break,
            },
        }
        // One timestamp per batch: the moment the batch was observed.
        let now = clock.now();
        for e in buf.drain(..) {
            let deadline = e.deadline().as_nanos() as u64;
            early += u64::from(now < deadline);
            deadlines.push(deadline);
            observed.push(now.saturating_sub(deadline));
            own.push(e.lateness().as_nanos() as u64);
        }
    }
    (observed, own, deadlines, lagged, early)
}

pub(super) fn lateness_expiremap(sel: &Select) {
    if !sel.lib("expiremap") || !sel.row("lateness") {
        return;
    }
    let clock = SystemClock::new();
    let map = ExpireMap::<u64, u64>::builder()
        .clock(clock)
        .event_capacity(1 << 20)
        .build();
    let sub = map.subscribe().expect("subscribe");
    let reader = thread::spawn(move || observe(sub, clock));
    for i in 0..N {
        map.put(key(i), i, spread_ttl(i));
    }
    let fill_end = clock.now();
    let (observed, own, deadlines, lagged, early) = reader.join().unwrap();
    drop(map);
    if early > 0 {
        println!("WARNING expiremap: {early} events observed before their deadline");
    }
    // The same lateness split by whether the deadline fell while the insert
    // loop was still running (3 busy threads on 2 cores) or after it.
    let split = |during: bool| -> Vec<u64> {
        deadlines
            .iter()
            .zip(&observed)
            .filter(|&(&d, _)| (d <= fill_end) == during)
            .map(|(_, &l)| l)
            .collect()
    };
    lateness_report(
        "expiremap",
        "deadline during the fill",
        split(true),
        0,
        false,
    );
    lateness_report(
        "expiremap",
        "deadline after the fill",
        split(false),
        0,
        false,
    );
    lateness_report(
        "expiremap",
        "observed by subscriber",
        observed,
        lagged,
        true,
    );
    lateness_report("expiremap", "removed_at - deadline", own, lagged, false);
}

/// moka per-entry expiry for row 7: TTL `spread_ttl(value)`; records the
/// deadline moka uses (`created_at + ttl`) for the listener.
pub(super) struct SpreadExpiry {
    origin: Instant,
    deadlines: Arc<Vec<AtomicU64>>,
}

impl Expiry<u64, u64> for SpreadExpiry {
    fn expire_after_create(&self, _: &u64, v: &u64, created_at: Instant) -> Option<Duration> {
        let ttl = spread_ttl(*v);
        let at = (created_at + ttl).saturating_duration_since(self.origin);
        self.deadlines[*v as usize].store(at.as_nanos() as u64, Ordering::Relaxed);
        Some(ttl)
    }
}

pub(super) fn lateness_moka(sel: &Select) {
    if !sel.lib("moka-expire") || !sel.row("lateness") {
        return;
    }
    let origin = Instant::now();
    let deadlines: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let late = Arc::new(Mutex::new(Vec::with_capacity(N as usize)));
    let seen = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let cache: MokaCache = {
        let (deadlines, late, seen, other) =
            (deadlines.clone(), late.clone(), seen.clone(), other.clone());
        moka::sync::Cache::builder()
            .max_capacity(N)
            .expire_after(SpreadExpiry {
                origin,
                deadlines: deadlines.clone(),
            })
            .eviction_listener(move |_k, v: u64, cause| {
                if cause == RemovalCause::Expired {
                    let now = origin.elapsed().as_nanos() as u64;
                    let d = deadlines[v as usize].load(Ordering::Relaxed);
                    late.lock().unwrap().push(now.saturating_sub(d));
                    seen.fetch_add(1, Ordering::Relaxed);
                } else {
                    other.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build_with_hasher(ahash::RandomState::new())
    };
    for i in 0..N {
        cache.insert(key(i), i);
    }
    let fill_end = Instant::now();
    // moka evicts only inside its maintenance: drive it in a loop.
    while seen.load(Ordering::Relaxed) + other.load(Ordering::Relaxed) < N
        && fill_end.elapsed() < PATIENCE
    {
        cache.run_pending_tasks();
    }
    drop(cache);
    let late = std::mem::take(&mut *late.lock().unwrap());
    let lost = N - late.len() as u64;
    println!(
        "late    moka-expire     other removal causes: {}",
        other.load(Ordering::Relaxed)
    );
    lateness_report("moka-expire", "eviction listener", late, lost, true);
}
